"""Peer KV transfer: tickets (who may read which blocks) and the data plane that moves them."""
