"""Extraction's compute lanes: batches in parallel, results in order, an error stops the rest."""

import threading

import pytest
import torch

from vlbert.utils.threads import ComputeLanes, lane_count, thread_count


def test_results_arrive_in_submission_order_with_single_threaded_ops_on_each_lane():
    first_may_finish = threading.Event()
    seen_threads = []

    def compute(batch):
        seen_threads.append(torch.get_num_threads())
        if batch == 0:
            assert first_may_finish.wait(5)  # the second batch finishes first
        else:
            first_may_finish.set()
        return batch * 10

    delivered = []
    with ComputeLanes(compute, 2, lambda result, note: delivered.append((result, note))) as lanes:
        for batch in range(5):
            lanes.submit(batch, f"note {batch}")
        lanes.finish()
    assert delivered == [(0, "note 0"), (10, "note 1"), (20, "note 2"), (30, "note 3"), (40, "note 4")]
    assert set(seen_threads) == {1}


def test_a_failing_batch_is_raised_and_nothing_after_it_is_delivered():
    def compute(batch):
        if batch == 1:
            raise ValueError("batch 1 failed")
        return batch

    delivered = []
    with pytest.raises(ValueError, match="batch 1 failed"):
        with ComputeLanes(compute, 2, lambda result, note: delivered.append(result)) as lanes:
            for batch in range(4):
                lanes.submit(batch, None)
            lanes.finish()
    assert delivered == [0]


def test_one_lane_computes_in_the_calling_thread():
    callers = []
    with ComputeLanes(lambda batch: callers.append(threading.current_thread()), 1, lambda *_: None) as lanes:
        lanes.submit(0, None)
    assert callers == [threading.current_thread()]


def test_the_user_count_wins_over_the_defaults():
    assert thread_count(None, {}) == 1
    assert thread_count(None, {"OMP_NUM_THREADS": "3,2"}) == 3
    assert thread_count(4, {"OMP_NUM_THREADS": "3"}) == 4
    assert lane_count(None, {"OMP_NUM_THREADS": "5"}) == 5
    assert 1 <= lane_count(None, {}) <= 4
