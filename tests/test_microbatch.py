"""Splitting a device's batch into the micro-batches of gradient accumulation."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from optuna_saturn.planner import Option
from optuna_saturn.training.microbatch import AccumulationError, partition, split_batch


def test_one_micro_batch_is_the_batch_itself():
    batch = (torch.arange(6),)
    ((part, share),) = split_batch(batch, 1)
    assert part is batch and share == 1.0


def test_nested_batches_split_along_the_first_dimension_in_order():
    Pair = namedtuple("Pair", "x y")
    batch = {"ids": torch.arange(8).view(4, 2), "pair": Pair(torch.arange(4), [torch.ones(4), "tag"]), "n": 3}
    parts = [part for part, share in split_batch(batch, 2)]
    assert len(parts) == 2
    assert torch.equal(torch.cat([p["ids"] for p in parts]), batch["ids"])
    assert isinstance(parts[1]["pair"], Pair) and parts[1]["pair"].x.tolist() == [2, 3]
    assert parts[0]["pair"].y[1] == "tag" and parts[0]["n"] == 3  # non-tensor leaves go to every part
    assert parts[0]["pair"].y[0].shape == (2,)


@pytest.mark.parametrize(
    ("batch", "parts", "message"),
    [
        ((torch.zeros(4), torch.zeros(6)), 2, "same first dimension"),
        ({"flag": True}, 2, "no tensor with a batch dimension"),
    ],
)
def test_batches_that_cannot_be_split_name_the_fix(batch, parts, message):
    with pytest.raises(AccumulationError, match=message):
        split_batch(batch, parts)


def test_a_short_last_batch_splits_unevenly_with_each_part_weighted_by_its_rows():
    parts = split_batch(torch.arange(10), 4)
    assert [p.tolist() for p, _ in parts] == [[0, 1], [2, 3, 4], [5, 6], [7, 8, 9]]
    assert [share for _, share in parts] == [0.2, 0.3, 0.2, 0.3]


def test_fewer_rows_than_parts_repeat_rows_and_every_row_still_weighs_the_same():
    """A last batch of 3 rows over 4 micro-batches: no part is empty (GPT-2 cannot run on zero rows); row 0
    appears twice at half weight each, so each row counts 1/3 in total."""
    parts = split_batch(torch.arange(3), 4)
    assert [p.tolist() for p, _ in parts] == [[0], [1], [2], [0]]
    assert [share for _, share in parts] == pytest.approx([1 / 6, 1 / 3, 1 / 3, 1 / 6])


@pytest.mark.parametrize(("rows", "parts"), [(1, 1), (1, 8), (7, 2), (16, 16), (5, 8), (31, 8), (100, 7)])
def test_partition_covers_every_row_with_nonempty_pieces_and_equal_row_weight(rows, parts):
    pieces = partition(rows, parts)
    assert len(pieces) == parts and all(hi > lo for lo, hi, _ in pieces)
    weight = [0.0] * rows
    for lo, hi, share in pieces:
        for row in range(lo, hi):
            weight[row] += share / (hi - lo)
    assert weight == pytest.approx([1 / rows] * rows)
    assert max(hi - lo for lo, hi, _ in pieces) - min(hi - lo for lo, hi, _ in pieces) <= 1


def test_option_with_accumulation_round_trips_through_json_and_keeps_its_identity():
    plain, split = Option("single", 1, 10.0), Option("single", 1, 14.0, gradient_accumulation=4)
    assert plain.to_json() == {"strategy": "single", "devices": 1, "runtime": 10.0}  # unchanged for plain options
    assert Option.from_json(split.to_json()) == split
    assert split.label == "single ×1 (4 micro-batches)" and split.slug == "singlex1-accum4"
    assert plain.choice != split.choice
    with pytest.raises(ValueError, match="gradient_accumulation must be a positive int"):
        Option("single", 1, 1.0, gradient_accumulation=0)


def _trial(gradient_accumulation: int):
    from optuna_saturn.engines import WorkerContext, engine_for
    from optuna_saturn.strategy import load_strategies
    from optuna_saturn.trial import SaturnTrial

    context = WorkerContext(0, 0, 1, torch.device("cpu"), {}, {}, gradient_accumulation, None, "single")
    return SaturnTrial(
        number=0,
        strategy=load_strategies()["single"],
        engine=engine_for("single", context),
        channel=None,
        control_group=None,
    )


@pytest.mark.parametrize("rows", [8, 10, 3])  # 10 rows: split 2 + 3 + 2 + 3; 3 rows: one repeats
def test_accumulated_gradients_equal_the_whole_batch_gradient(rows):
    x, y = torch.randn(rows, 3), torch.randn(rows, 1)
    grads = []
    for micro_batches in (1, 4):
        trial = _trial(micro_batches)
        torch.manual_seed(0)
        model = trial.prepare(torch.nn.Linear(3, 1))
        for mx, my in trial.micro_batches((x, y)):
            trial.backward(torch.nn.functional.mse_loss(model(mx), my))
        grads.append(model.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_backward_outside_micro_batches_is_refused_when_accumulating():
    trial = _trial(2)
    model = trial.prepare(torch.nn.Linear(3, 1))
    with pytest.raises(AccumulationError, match=r"outside `for part in trial.micro_batches\(batch\):`"):
        trial.backward(model(torch.randn(4, 3)).sum())


def test_a_micro_batch_without_trial_backward_is_refused_when_accumulating():
    trial = _trial(2)
    model = trial.prepare(torch.nn.Linear(3, 1))
    with pytest.raises(AccumulationError, match=r"Call trial.backward\(loss\), not loss.backward\(\)"):
        for part in trial.micro_batches(torch.randn(4, 3)):
            model(part).sum().backward()
