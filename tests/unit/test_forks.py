"""runner.fleet.fleet.Forks: host calls granted in list order even when a later host's thread asks first (the
canary is asked first whatever the threads' pace), and a host that ends without a call holds nobody up."""
import threading
import time

from runner.deadline import Deadline
from runner.fleet.fleet import Forks


def ask(forks: Forks, index: int, order: list, hold: float = 0.05) -> threading.Thread:
    def call():
        with forks.call(index, Deadline(10)) as granted:
            order.append((index, granted))
            time.sleep(hold)
    thread = threading.Thread(target=call)
    thread.start()
    return thread


def test_a_later_host_asking_first_waits_for_the_first_hosts_first_call():
    forks, order = Forks(1, first=[0, 1, 2]), []
    late = [ask(forks, 2, order), ask(forks, 1, order)]
    time.sleep(0.3)
    assert order == []  # host 0 has not asked yet: nobody goes before it
    early = ask(forks, 0, order)
    for thread in [early, *late]:
        thread.join(timeout=10)
    assert order == [(0, True), (1, True), (2, True)]


def test_a_host_done_without_a_call_lets_the_next_go():
    forks, order = Forks(1, first=[0, 1]), []
    thread = ask(forks, 1, order)
    time.sleep(0.2)
    assert order == []
    forks.done(0)  # host 0 was held or skipped: it will never ask
    thread.join(timeout=10)
    assert order == [(1, True)]


def test_later_calls_of_a_host_are_not_held_by_hosts_yet_to_ask():
    forks, order = Forks(2, first=[0, 1]), []
    ask(forks, 0, order).join(timeout=10)
    ask(forks, 0, order).join(timeout=10)  # host 0's second call: host 1 has not asked, and need not have
    assert order == [(0, True), (0, True)]


def test_the_deadline_still_bounds_a_wait():
    forks = Forks(1, first=[0, 1])
    began = time.monotonic()
    with forks.call(1, Deadline(0.3)) as granted:
        assert granted is False
    assert time.monotonic() - began < 5
