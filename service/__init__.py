"""kvmesh metadata service: the block-hash index (``service.index``), routing policies
(``service.policy``), worker liveness (``service.liveness``) and the gRPC server
(``service.server.create_server``; ``python -m service`` / ``kvmesh service``).

Never imports torch: the service runs on any small CPU box.
"""
