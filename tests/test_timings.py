"""The stage marks (`odqa.common.timings`): free where nobody records, each stage's own time where
someone does, and apart in each thread."""
import threading
import time

from odqa.common.timings import recording, stage


def test_a_stage_counts_its_own_time_and_an_inner_stage_counts_to_itself():
    with recording() as seconds:
        with stage("outer"):
            time.sleep(0.02)
            with stage("inner"):
                time.sleep(0.05)
        with stage("inner"):
            time.sleep(0.01)
    assert 0.015 < seconds["outer"] < 0.05
    assert 0.055 < seconds["inner"] < 0.12


def test_marks_are_no_ops_unless_recording_and_work_as_decorators():
    @stage("work")
    def work():
        return 7

    assert work() == 7                       # nobody records: nothing kept anywhere
    with recording() as seconds:
        work()
    assert set(seconds) == {"work"}
    with recording() as again:
        pass
    assert again == {}


def test_each_thread_records_on_its_own():
    found = {}

    def other():
        with stage("elsewhere"):
            time.sleep(0.01)
        found["done"] = True

    with recording() as seconds:
        t = threading.Thread(target=other)
        t.start()
        t.join()
        with stage("here"):
            pass
    assert found["done"] and set(seconds) == {"here"}
