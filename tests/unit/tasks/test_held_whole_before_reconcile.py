"""The whole held set is written again before the watchdog's reconciliation after a failover
judges which turns no node holds: a held record the failover lost and not yet written again would
re-drive a step whose model call is in flight, and pay that call twice (docs/failover.md)."""

from tasks import liveness, watchdog


def test_the_whole_held_set_is_rewritten_well_within_the_reconciliations_settle():
    # Two rewrites fit in the settle, and a flush's own period on top of each.
    assert 2 * (liveness.HELD_WHOLE_SECONDS + liveness.HELD_FLUSH_SECONDS) <= watchdog.SETTLE_AFTER_RESTART
