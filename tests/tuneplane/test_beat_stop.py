"""Beat stops when asked, whatever it is doing (issue 49: a console that stops only when asked,
and then does). Celery's own beat saves its schedule inside its SIGTERM handler; with the
database scheduler that is a query, and a SIGTERM that lands while beat's own query holds
psycopg's connection lock (not re-entrant) hung beat for good: the full suite saw beat
killed after 30 s at the end of e2e tests (tests/e2e/running.py's ``stopped``). Here the
handler beat runs with is called while this thread holds that lock, as the interrupted
query would."""

import faulthandler
import signal
from contextlib import contextmanager

import pytest
from celery import beat
from celery.apps.beat import Beat
from celery.signals import beat_init
from django.db import connection

from tuneplane.celery import app
from tuneplane.schedule import seed_schedule

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@contextmanager
def handlers_kept():
    kept = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in kept.items():
            signal.signal(signum, handler)
        faulthandler.unregister(signal.SIGUSR1)  # beat's, registered at its start


@contextmanager
def at_most(seconds: int, what: str):
    """An AssertionError if the block takes longer (a lock wait is interrupted by it)."""

    def late(signum, frame):
        raise AssertionError(f"{what} still waiting after {seconds} s")

    previous = signal.signal(signal.SIGALRM, late)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def connections_kept_for(seconds: int):
    """The database connection made anew, kept ``seconds`` after each use (CONN_MAX_AGE: 0,
    the default, closes it at the next close_old_connections; an operator may keep it)."""
    kept = connection.settings_dict["CONN_MAX_AGE"]
    connection.close()
    connection.settings_dict["CONN_MAX_AGE"] = seconds
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict["CONN_MAX_AGE"] = kept


@pytest.mark.parametrize("max_age", [0, 600])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_that_lands_in_the_middle_of_beats_query_ends_its_loop_not_beat(signum, max_age):
    """With the connection kept, Celery's handler waited on the lock its own query held, for
    good; with it closed at each use, it closed the connection under that query. Either way
    the handler now touches no connection: beat's loop ends at its next look, and its schedule
    is saved there."""
    assert connection.vendor == "postgresql"
    seed_schedule()
    with connections_kept_for(max_age), handlers_kept():
        service = beat.Service(app, scheduler_cls=app.conf.beat_scheduler)
        scheduler = service.scheduler  # the database scheduler, its entries read
        scheduler._dirty.update(scheduler.schedule)  # ticks sent them: each saved at a sync
        Beat(app=app).install_sync_handler(service)  # as `celery beat` does, then starts:
        beat_init.send(sender=service)
        handler = signal.getsignal(signum)
        connection.ensure_connection()
        query = connection.connection
        with query.lock, at_most(5, "beat's stop"):  # beat's own query, mid-way
            handler(signum, None)
        assert not query.closed  # the query goes on
        assert service._is_shutdown.is_set()  # and the loop ends at its next look
        assert scheduler._dirty  # saving its schedule there, never in the handler
        scheduler.close()
        assert not scheduler._dirty
