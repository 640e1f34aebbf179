"""Offers: taken once, for their transport, within their TTL; lapsed ones released."""
from __future__ import annotations

import pytest

from kvmesh.transfer.frames import TransferError
from kvmesh.transfer.offers import OfferBook


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_offer_is_taken_once() -> None:
    book = OfferBook()
    offer = book.add("zmq", [b"ab", b"cd"], 30)
    assert book.take(offer.key, "zmq") is offer and offer.block_bytes == 2
    with pytest.raises(TransferError) as e:
        book.take(offer.key, "zmq")
    assert e.value.reason == "refused"


def test_an_offer_for_another_transport_is_refused_and_kept() -> None:
    book = OfferBook()
    offer = book.add("shm", [b"ab"], 30)
    with pytest.raises(TransferError) as e:
        book.take(offer.key, "zmq")
    assert e.value.reason == "refused"
    assert book.take(offer.key, "shm") is offer


def test_a_lapsed_offer_is_expired_and_its_blocks_released() -> None:
    clock, ended = _Clock(), []
    book = OfferBook(clock)
    offer = book.add("zmq", [b"ab"], 1.0, on_done=ended.append)
    clock.now += 1.0
    book.add("zmq", [b"cd"], 1.0)  # adding sweeps too
    assert ended == ["expired"] and offer.blocks == [] and len(book) == 1
    with pytest.raises(TransferError) as e:
        book.take(offer.key, "zmq")
    assert e.value.reason == "expired"


def test_an_offer_ends_once_and_a_failing_callback_is_contained() -> None:
    ended: list[str] = []

    def boom(outcome: str) -> None:
        ended.append(outcome)
        raise RuntimeError("the source's bug")

    book = OfferBook()
    offer = book.add("zmq", [b"ab"], 30, on_done=boom)
    offer.finish("sent")
    offer.finish("failed")
    kept = book.add("shm", [b"cd"], 30, on_done=ended.append)
    book.clear()
    assert ended == ["sent", "closed"] and kept.blocks == []


def test_keys_are_random_and_distinct() -> None:
    book = OfferBook()
    keys = {book.add("zmq", [b"x"], 30).key for _ in range(100)}
    assert len(keys) == 100 and all(len(k) == 16 for k in keys)


@pytest.mark.parametrize(("blocks", "ttl"), [([], 1), ([b"a", b"bc"], 1), ([b""], 1),
                                             ([b"a"], 0)])
def test_bad_offers_are_refused(blocks, ttl) -> None:
    with pytest.raises(ValueError):
        OfferBook().add("zmq", blocks, ttl)
