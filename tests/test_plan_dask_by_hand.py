"""DaskExecutor by hand (issue 18): its waits, its worker checks, its errors and what it cancels, driven by a
scripted client on a fake clock, so every poll, tick and message is worked out in the comments (no cluster:
tests/test_plan.py runs the real ones).

The script follows distributed's semantics as DaskExecutor uses them: ``wait(fs, timeout)`` returns when every
future in ``fs`` is done, or raises TimeoutError after ``timeout`` s; ``Future.result(timeout)`` returns the value
(or raises the task's error) once done, else raises TimeoutError after ``timeout`` s; ``client.nthreads()`` maps
each worker to its threads. Time passes only in waits: a wait that times out moves the clock by its timeout, one
that returns moves it to the last of its futures' finishing times."""
import math
import sys
from concurrent.futures import CancelledError
from types import SimpleNamespace

import pytest

distributed = pytest.importorskip("distributed")
from distributed import KilledWorker  # noqa: E402

import pdsim.plan as plan  # noqa: E402
from pdsim.errors import ConfigError, PdsimError  # noqa: E402
from pdsim.plan import DaskExecutor  # noqa: E402

NEVER = math.inf
LOST = "lost"            # done, but its data went with a dead worker: fetching it times out every time


class World:
    """The clock, the workers over time and a log of every call the executor makes."""

    def __init__(self, t0=100.0, workers=lambda t: 1, limit=60):
        self.t, self.workers, self.limit = t0, workers, limit
        self.log, self.ticks, self.cancelled, self.waits = [], [], [], []
        self.wait_error = None            # raised by the next wait, once (a scheduler that cancelled everything)

    def monotonic(self):
        return self.t

    def step(self, what):
        self.log.append((what, self.t))
        if len(self.log) > self.limit:    # a mutant that polls forever fails here instead of hanging
            raise AssertionError(f"still polling at t={self.t}: {self.log[-5:]}")

    def wait(self, fs, timeout=None, return_when="ALL_COMPLETED"):
        fs = list(fs)
        self.step("wait")
        self.waits.append((len(fs), timeout))
        if self.wait_error is not None:
            exc, self.wait_error = self.wait_error, None
            raise exc
        last = max(f.at for f in fs)
        if timeout is None:
            if math.isinf(last):
                raise AssertionError("a wait without a timeout on a future that never finishes hangs")
            self.t = max(self.t, last)
        elif last <= self.t + timeout:
            self.t = max(self.t, last)
        else:
            self.t += timeout
            raise TimeoutError

    def tick(self):
        self.ticks.append(self.t)


class Fut:
    def __init__(self, world, at, value=None, error=None, status=None):
        self.world, self.at, self.value, self.error, self._status = world, at, value, error, status

    def done(self):
        return self.world.t >= self.at

    @property
    def status(self):
        if self._status is not None and self.done():
            return self._status
        if not self.done():
            return "pending"
        return "error" if self.error is not None else "finished"

    def result(self, timeout=None):
        w = self.world
        w.step("result")
        if self._status == LOST and self.done():
            if timeout is None:
                raise AssertionError("a result without a timeout, held by a dead worker, hangs")
            w.t += timeout
            raise TimeoutError
        if self.at > w.t + (NEVER if timeout is None else timeout):
            if timeout is None:
                raise AssertionError("a result without a timeout on a future that never finishes hangs")
            w.t += timeout
            raise TimeoutError
        w.t = max(w.t, self.at)
        if self.error is not None:
            raise self.error
        return self.value


class RerunFails(Fut):
    """Done at 100 but lost with its worker's data; on its second fetch the task, run again, fails with its
    own TimeoutError while the fetch waits (the status turns to "error" during the wait)."""

    def __init__(self, world, value):
        super().__init__(world, 100.0, value, status=LOST)
        self.fetches = 0

    def result(self, timeout=None):
        self.fetches += 1
        if self.fetches < 2:
            return super().result(timeout)
        self.world.step("result")
        self.world.t += timeout
        self._status, self.error = None, TimeoutError("the task's own, run again")
        raise self.error


class FakeClient:
    """Stands in for distributed.Client (patched in, so DaskExecutor's isinstance check takes it)."""
    made = []

    def __init__(self, address=None, timeout=None, world=None, plan_=None, scheduler_address="tcp://s:1"):
        FakeClient.made.append((address, timeout))
        self.world, self.plan_ = world, plan_ or []
        self.scheduler = SimpleNamespace(address=scheduler_address)
        self.maps, self.closed = [], 0

    def map(self, fn, tasks, pure=True):
        self.maps.append((fn, list(tasks), pure))
        return [how(self.world, fn(x)) if callable(how) else Fut(self.world, how[0], fn(x), *how[1:])
                for x, how in zip(tasks, self.plan_)]

    def nthreads(self):
        self.world.step("nthreads")
        n = self.world.workers(self.world.t)
        if isinstance(n, BaseException):
            raise n
        return {f"tcp://w:{i}": 1 for i in range(n)}

    def cancel(self, futures):
        self.world.cancelled.append([f.value for f in futures])

    def close(self):
        self.closed += 1


def tenfold(x):
    return 10 * x


def ok(at):
    return (at, None, None)


@pytest.fixture
def world(monkeypatch):
    w = World()
    FakeClient.made = []
    monkeypatch.setattr(distributed, "Client", FakeClient)
    monkeypatch.setattr(distributed, "wait", w.wait)
    monkeypatch.setattr(plan, "time", SimpleNamespace(monotonic=w.monotonic))
    return w


def executor(world, plan_, address="tcp://s:1", **kw):
    client = FakeClient(world=world, plan_=plan_, scheduler_address=address)
    FakeClient.made = []
    return DaskExecutor(client, **kw), client


def test_results_in_task_order_with_a_tick_per_finished_task(world):
    """poll 1 s; tasks 3, 1, 4 finish at 100.5, 102.5, 101.2 (clock from 100):
    wait times out at 101 (task 0 done: 1 tick) and 102 (task 2 too: 1 tick), then returns at 102.5 (1 tick);
    results by task, not by finishing order: 30, 10, 40. The one worker is checked after each timeout (101,
    102); nothing is left to cancel; tasks go out as impure (a plan task may be resubmitted on purpose)."""
    ex, client = executor(world, [ok(100.5), ok(102.5), ok(101.2)], poll_s=1.0, lost_workers_s=3.0)
    assert ex.map(tenfold, [3, 1, 4], on_done=world.tick) == [30, 10, 40]
    assert client.maps == [(tenfold, [3, 1, 4], False)]
    assert world.ticks == [101.0, 102.0, 102.5]
    assert world.waits == [(3, 1.0), (3, 1.0), (3, 1.0)]
    assert [e for e in world.log if e[0] == "nthreads"] == [("nthreads", 101.0), ("nthreads", 102.0)]
    assert world.cancelled == [] and world.t == 102.5


def test_without_on_done_and_all_ready(world):
    """Everything finished at 100: one wait returns at once, one result each, no worker check, no tick needed."""
    ex, client = executor(world, [ok(100.0), ok(99.0)], poll_s=2.0)
    assert ex.map(tenfold, [7, 8]) == [70, 80]
    assert world.log == [("wait", 100.0), ("result", 100.0), ("result", 100.0)]
    assert world.waits == [(2, 2.0)] and world.cancelled == []


def test_results_lost_with_the_last_worker_end_at_the_limit_exactly(world):
    """The race seen in CI: every task is done, then the only worker dies holding two results.
    poll 1 s, no workers for 3 s ends it. At 100: wait returns (3 ticks), task 0's result is read, task 1's
    times out (101): no workers, alone since 101. Each later pass: the wait returns at once, task 1's result
    times out again (102, 103, 104), the check after it: 1 s, 2 s, then 104 - 101 = 3 s >= 3 s: the error, at
    104 exactly (not one poll later). Tasks 1 and 2 are done but their results never came: 2 of 3 not
    received; nothing to cancel."""
    world.workers = lambda t: 0
    ex, client = executor(world, [ok(100.0), (100.0, None, LOST), (100.0, None, LOST)], address="tcp://s:1",
                          poll_s=1.0, lost_workers_s=3.0)
    with pytest.raises(PdsimError) as err:
        ex.map(tenfold, [1, 2, 3], on_done=world.tick)
    # tasks 1 and 2 finished on workers that left: their results never arrived (2 of 3), not "0 unfinished"
    assert str(err.value) == ("the Dask scheduler tcp://s:1 has had no workers for 3 s (2 of 3 results not "
                              "received); the plan stopped: start workers and run it again (earlier rounds' "
                              "results are cached; this round's simulations run again)")
    assert world.t == 104.0 and world.ticks == [100.0, 100.0, 100.0]
    assert [t for what, t in world.log if what == "nthreads"] == [101.0, 102.0, 103.0, 104.0]
    assert world.cancelled == []


def test_workers_that_come_back_reset_the_count(world):
    """poll 1 s, limit 2.5 s; task 0 finishes at 100.5, tasks 1-3 never. Workers: 2 until 102, none at 102, one
    at 103, none from 104. Waits time out at 101 (1 tick), 102, ...; the checks: 101 two workers; 102 none (alone
    since 102); 103 one (reset); 104 none (alone since 104); 105 1 s, 106 2 s, 107 3 s >= 2.5 s: the error at
    107, with 4 of 4 results not received (task 0's was never read) and the 3 unfinished cancelled. (Without the reset it would end at 105: 105 - 102 >= 2.5.)"""
    world.workers = lambda t: 2 if t < 102 else (0 if t < 103 else (1 if t < 104 else 0))
    ex, client = executor(world, [ok(100.5), ok(NEVER), ok(NEVER), ok(NEVER)], address="tcp://sched:8786",
                          poll_s=1.0, lost_workers_s=2.5)
    with pytest.raises(PdsimError) as err:
        ex.map(tenfold, [1, 2, 3, 4], on_done=world.tick)
    # no wait ever returned, so not even task 0's result was read: 4 of 4 not received
    assert str(err.value) == ("the Dask scheduler tcp://sched:8786 has had no workers for 2.5 s (4 of 4 "
                              "results not received); the plan stopped: start workers and run it again "
                              "(earlier rounds' results are cached; this round's simulations run again)")
    assert world.t == 107.0 and world.ticks == [101.0]
    assert [t for what, t in world.log if what == "nthreads"] == [101.0, 102.0, 103.0, 104.0, 105.0, 106.0, 107.0]
    assert world.cancelled == [[20, 30, 40]]
    assert world.waits == [(4, 1.0)] * 7


def test_no_workers_for_less_than_the_limit_is_waited_out(world):
    """poll 0.5 s, limit 2 s; no workers until 101.5, then one; the task finishes at 102.2. Checks at 100.5
    (alone since 100.5), 101 (0.5 s), 101.5 (one worker), 102 (one); the wait from 102 returns at 102.2."""
    world.workers = lambda t: 0 if t < 101.5 else 1
    ex, client = executor(world, [ok(102.2)], poll_s=0.5, lost_workers_s=2.0)
    assert ex.map(tenfold, [5], on_done=world.tick) == [50]
    assert [t for what, t in world.log if what == "nthreads"] == [100.5, 101.0, 101.5, 102.0]
    assert world.ticks == [102.2] and world.cancelled == []


@pytest.mark.parametrize("exc, text", [(OSError("connection refused"), "connection refused"),
                                       (TimeoutError("timed out after 20 s"), "timed out after 20 s")])
def test_a_scheduler_that_cannot_be_asked_ends_the_plan(world, exc, text):
    """The first wait times out at 101 (poll 1 s) and asking the scheduler for its workers fails: the error
    names the scheduler and the reason; both unfinished tasks are cancelled."""
    world.workers = lambda t: exc
    ex, client = executor(world, [ok(NEVER), ok(NEVER)], address="tcp://gone:8786", poll_s=1.0)
    with pytest.raises(PdsimError) as err:
        ex.map(tenfold, [1, 2])
    assert str(err.value) == f"lost the Dask scheduler tcp://gone:8786: {text}; the plan stopped"
    assert world.t == 101.0 and world.cancelled == [[10, 20]]


def test_a_task_error_is_raised_as_it_is_even_a_timeout(world):
    """A task's own exception ends the map as it is: a ValueError, and a TimeoutError, which must not be taken
    for a result that is not ready yet (task 0 is read first, task 1 raises)."""
    ex, client = executor(world, [ok(100.0), (100.0, ValueError("bad rate"), None)], poll_s=1.0)
    with pytest.raises(ValueError, match="^bad rate$"):
        ex.map(tenfold, [1, 2])
    world.t = 100.0
    ex, client = executor(world, [ok(100.0), (100.0, TimeoutError("the task's own"), None), ok(100.0)],
                          poll_s=1.0)
    with pytest.raises(TimeoutError, match="^the task's own$"):
        ex.map(tenfold, [1, 2, 3])
    assert world.cancelled == []


def test_a_task_timeout_raised_while_its_result_is_fetched_is_the_tasks(world):
    """poll 1 s, no workers for 1 s ends it, no workers ever. Task 0 is read at 100; task 1's result was lost:
    its first fetch times out at 101 (no workers: alone since 101); on the next pass its fetch ends at 102 with
    the task's own TimeoutError, the status now "error": that error ends the map, not "no workers" (which a
    check at 102 would say: 102 - 101 >= 1)."""
    world.workers = lambda t: 0
    ex, client = executor(world, [ok(100.0), RerunFails], poll_s=1.0, lost_workers_s=1.0)
    with pytest.raises(TimeoutError, match="^the task's own, run again$"):
        ex.map(tenfold, [1, 2])
    assert world.t == 102.0 and [t for what, t in world.log if what == "nthreads"] == [101.0]


def test_a_task_that_killed_its_workers(world):
    """distributed's KilledWorker (task 'sim-7', allowed 2 failures, so 3 workers died): the error names the
    scheduler, then distributed's own text."""
    killed = KilledWorker("sim-7", SimpleNamespace(address="tcp://w:2"), 2)
    ex, client = executor(world, [ok(100.0), (100.0, killed, None)], address="tcp://s:9", poll_s=1.0)
    with pytest.raises(PdsimError) as err:
        ex.map(tenfold, [1, 2])
    assert str(err.value).startswith("a simulation killed its Dask workers on tcp://s:9: Attempted to run task "
                                     "'sim-7' on 3 different workers")


def test_cancelled_tasks_give_one_line_with_how_many(world):
    """A scheduler that went away cancels what it held: of 3 tasks, task 0 finished, 1 and 2 cancelled.
    distributed's text has a line per key; the error keeps the first non-blank line, cut to 200 characters:
    'k' * 250 -> 'k' * 200. An empty text says 'cancelled'."""
    cancelled = CancelledError("\n  " + "k" * 250 + " cancelled\nsim-2 cancelled\n")
    ex, client = executor(world, [ok(100.0), (100.0, cancelled, "cancelled"), (100.0, cancelled, "cancelled")],
                          address="tcp://s:1", poll_s=1.0)
    world.wait_error = cancelled
    with pytest.raises(PdsimError) as err:
        ex.map(tenfold, [1, 2, 3])
    assert str(err.value) == f"lost the Dask scheduler tcp://s:1 (2 of 3 simulations cancelled: {'k' * 200}); " \
                             "the plan stopped"
    # the same from a result: the wait returns (all done), task 0 is read, task 1's result raises
    ex, client = executor(world, [ok(100.0), (100.0, CancelledError(), "cancelled"), ok(100.0)],
                          address="tcp://s:2", poll_s=1.0)
    with pytest.raises(PdsimError) as err:
        ex.map(tenfold, [1, 2, 3])
    assert str(err.value) == "lost the Dask scheduler tcp://s:2 (1 of 3 simulations cancelled: cancelled); " \
                             "the plan stopped"
    assert world.cancelled == []


def test_a_given_client_is_the_callers_and_named_by_its_scheduler(world):
    """Defaults: 60 s without workers (README: 'a scheduler left with no workers for 60 s'), polled each 1 s.
    A client passed in is not closed by close(); its name is its scheduler's address, or a plain description
    when the scheduler has none."""
    client = FakeClient(world=world, scheduler_address="tcp://10.0.0.5:8786")
    ex = DaskExecutor(client)
    assert (ex.lost_workers_s, ex.poll_s, ex.address, ex.client) == (60.0, 1.0, "tcp://10.0.0.5:8786", client)
    ex.close()
    assert client.closed == 0
    for sched in (SimpleNamespace(), SimpleNamespace(address=None), SimpleNamespace(address="")):
        client.scheduler = sched
        assert DaskExecutor(client).address == "the Dask scheduler"
    assert FakeClient.made == [(None, None)]          # no client made for a given one


def test_an_address_makes_a_client_owned_and_closed(world):
    """An address: a client made with a 20 s connect timeout, named by the address, closed once by close()."""
    ex = DaskExecutor("tcp://h:8786", lost_workers_s=5, poll_s=0.25)
    assert FakeClient.made == [("tcp://h:8786", 20)]
    assert (ex.address, ex.lost_workers_s, ex.poll_s) == ("tcp://h:8786", 5, 0.25)
    assert ex.client.closed == 0
    ex.close()
    assert ex.client.closed == 1


@pytest.mark.parametrize("scheduler", [None, ""])
def test_no_scheduler_is_a_config_error(world, scheduler):
    with pytest.raises(ConfigError) as err:
        DaskExecutor(scheduler)
    assert str(err.value) == "--scheduler: --executor dask needs --scheduler tcp://HOST:8786"
    assert err.value.key == "--scheduler" and FakeClient.made == []


@pytest.mark.parametrize("exc", [OSError("Connection refused"), TimeoutError("Timed out trying to connect")])
def test_an_unreachable_scheduler_is_a_config_error(world, monkeypatch, exc):
    class Unreachable(FakeClient):
        def __init__(self, address=None, timeout=None, **kw):
            FakeClient.made.append((address, timeout))
            raise exc
    monkeypatch.setattr(distributed, "Client", Unreachable)
    with pytest.raises(ConfigError) as err:
        DaskExecutor("tcp://h:1")
    assert str(err.value) == f"--scheduler = 'tcp://h:1': cannot reach the Dask scheduler: {exc}"
    assert (err.value.key, err.value.value) == ("--scheduler", "tcp://h:1")
    assert FakeClient.made == [("tcp://h:1", 20)]


def test_without_distributed_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)     # `from distributed import ...` raises ImportError
    with pytest.raises(ConfigError) as err:
        DaskExecutor("tcp://h:1")
    assert str(err.value) == "--executor = 'dask': the dask executor needs 'distributed': pip install 'pdsim[dask]'"
    assert (err.value.key, err.value.value) == ("--executor", "dask")
