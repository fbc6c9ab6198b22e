"""benchmarks/space_size.py: each op's schedule space, bound and valid estimate."""
import math

import felixjax as fj
from benchmarks.space_size import main, space_size
from codegen.space import Space, sketches_for

TARGET = fj.Target.cpu()
TASK = fj.ops.matmul(4, 8, 4)


def test_bound_is_the_sum_of_the_sketches_and_the_estimate_near_the_enumeration():
    r = space_size(TASK, TARGET, draws=4000)
    spaces = [Space(TASK, sk, TARGET) for sk in sketches_for(TASK, TARGET)]
    assert r["sketches"] == len(spaces)
    assert math.isclose(r["log10_bound"], math.log10(sum(sp.size() for sp in spaces)))
    exact = sum(1 for sp in spaces for _ in sp.enumerate())
    assert 0 < exact < sum(sp.size() for sp in spaces)
    assert abs(r["log10_valid"] - math.log10(exact)) < 0.05  # within ~12%: 4000 draws per sketch


def test_cli_prints_one_row_per_op(capsys):
    assert main(["--suite", "", "--ops", "matmul:m=4;n=8;k=4,dense:n=1;in=16;out=8", "--draws", "200"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ops |")]
    assert [row.split(" | ")[1] for row in rows] == ["matmul_4x8x4", "dense_1x16_8"]
