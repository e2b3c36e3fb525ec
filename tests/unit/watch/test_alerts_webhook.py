"""The alert book behind --webhook: what starts, resolves, is re-sent, and waits while delivery fails."""

from kvops.watch.alerts import Alert, AlertBook, rfc3339


def alert(name: str, description: str = "d") -> Alert:
    return Alert(
        {"alertname": name, "severity": "warning", "instance": "a:1"},
        {"summary": "s", "description": description, "runbook_url": "r"},
        starts_at=0.0,
    )


def test_start_resolve_and_resend_every_minute():
    book = AlertBook(resend_seconds=60)
    assert [a.status for a in book.reconcile([alert("KVCacheWarn")], now=100)] == ["firing"]
    sent = book.take()
    book.delivered(100)
    assert [a.payload() for a in sent] == [
        {
            "labels": {"alertname": "KVCacheWarn", "severity": "warning", "instance": "a:1"},
            "annotations": {"summary": "s", "description": "d", "runbook_url": "r"},
            "startsAt": rfc3339(100),
        }
    ]
    assert (
        book.reconcile([alert("KVCacheWarn", "newer")], now=130) == [] and book.take() == []
    )  # nothing new, no resend yet
    book.reconcile([alert("KVCacheWarn", "newest")], now=161)
    resent = book.take()
    assert [(a.status, a.annotations["description"], a.starts_at) for a in resent] == [("firing", "newest", 100)]
    book.delivered(161)
    resolved = book.reconcile([], now=170)
    assert [(a.status, a.ends_at) for a in resolved] == [("resolved", 170)]
    assert book.take()[0].payload()["endsAt"] == rfc3339(170) and book.firing == {}


def test_queued_alerts_keep_their_text_and_wait_for_delivery():
    book = AlertBook()
    book.reconcile([alert("KVCacheCritical", "97%")], now=10)
    book.reconcile([alert("KVCacheCritical", "20%")], now=11)  # held by dwell while usage fell
    sending = book.take()
    assert sending[0].annotations["description"] == "97%"  # what was true when it started
    book.restore(sending)  # the receiver failed: nothing is lost
    book.reconcile([], now=12)
    (ended,) = book.take()  # the resolution replaces the queued firing; it carries both ends of the story
    assert (ended.status, ended.starts_at, ended.ends_at) == ("resolved", 10, 12)
