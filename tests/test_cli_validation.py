"""Command-line input validation (issue 12): every user error is one line on stderr and exit code 2,
nothing runs; bad cost-model checkpoints and non-finite ONNX weights are clear errors; --quiet."""
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import felixjax as fj
from felixjax.cli import _parser
from felixjax.cli import main as cli

OP = ["--op", "matmul:m=8,n=8,k=8", "--strategy", "random", "--no-compare"]


def one_line_exit_2(argv, capsys, msg) -> str:
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("flag, value, msg", [
    ("--seconds", "0", "--seconds must be a positive"),
    ("--seconds", "-1", "--seconds must be a positive"),
    ("--seconds", "nan", "--seconds must be a positive"),
    ("--threads", "0", "--threads must be >= 1"),
    ("--threads", "-1", "--threads must be >= 1"),
    ("--trials", "0", "--trials must be >= 1"),
    ("--trials", "-3", "--trials must be >= 1"),
])
def test_tune_budgets_and_threads(flag, value, msg, tmp_path, capsys):
    db = tmp_path / "t.db"
    one_line_exit_2(["tune", *OP, "--db", str(db), flag, value], capsys, msg)
    assert not db.exists()  # nothing ran


@pytest.mark.parametrize("flag, value", [("--seconds", "0"), ("--seconds", "-1"), ("--threads", "0"),
                                         ("--threads", "-2"), ("--trials", "-1"), ("--seeds", "0"),
                                         ("--warmup", "-1")])
def test_compare_budgets_and_threads(flag, value, tmp_path, capsys):
    out = tmp_path / "cmp"
    one_line_exit_2(["compare", "--op", "matmul:m=8,n=8,k=8", "--replay", "--out", str(out), flag, value], capsys,
                    "must be")
    assert not out.exists()


@pytest.mark.parametrize("strategies, msg", [(",", "no strategy named"), ("random,random", "named twice")])
def test_compare_strategy_lists(strategies, msg, tmp_path, capsys):
    """Session 72: these failed after the --out folder was made."""
    out = tmp_path / "cmp"
    one_line_exit_2(["compare", "--op", "matmul:m=8,n=8,k=8", "--replay", "--out", str(out), "--strategies",
                     strategies], capsys, msg)
    assert not out.exists()


def test_build_threads(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    fj.zoo.save("transformer_block", str(model))
    one_line_exit_2(["build", str(model), "-o", str(tmp_path / "b"), "--threads", "0"], capsys, "--threads must be")
    (tmp_path / "f").write_text("mine")  # session 72: -o naming a file was a bare "[Errno 17] File exists"
    one_line_exit_2(["build", str(model), "-o", str(tmp_path / "f")], capsys, "a file is there; give a folder")
    assert (tmp_path / "f").read_text() == "mine"
    # session 73: a model's --trials may be 0 (re-time only), and the message said ">= 1"; --in-network -1 passed
    one_line_exit_2(["tune", str(model), "--db", str(tmp_path / "t.db"), "--trials", "-1"], capsys, "must be >= 0")
    one_line_exit_2(["tune", str(model), "--db", str(tmp_path / "t.db"), "--in-network", "-1"], capsys,
                    "--in-network must be >= 0")


def test_tune_summary_ms_keeps_tiny_kernels_readable():
    """Session 72: a kernel of a few microseconds printed as '0.0000 ms'."""
    from felixjax.cli import _ms

    assert _ms(3.3e-6) == "0.0033 ms" and _ms(2.5e-9) == "2.5e-06 ms" and _ms(0.0123456) == "12.35 ms"


def test_compare_out_naming_an_existing_file(tmp_path, capsys):
    out = tmp_path / "results.txt"
    out.write_text("keep me\n")
    one_line_exit_2(["compare", "--op", "matmul:m=8,n=8,k=8", "--replay", "--trials", "2", "--seeds", "1",
                     "--out", str(out)], capsys, "is a file, not a folder")
    assert out.read_text() == "keep me\n"


def test_compare_cost_model_without_a_learned_strategy(tmp_path, capsys):
    """Session 82, a review: the flag was ignored (exit 0), a missing checkpoint never looked at."""
    one_line_exit_2(["compare", "--op", "matmul:m=8,n=8,k=8", "--replay", "--trials", "2", "--seeds", "1",
                     "--strategies", "random", "--cost-model", str(tmp_path / "none.npz"),
                     "--out", str(tmp_path / "o")], capsys, "--cost-model needs a strategy with a cost model")


def bad_checkpoints(tmp_path) -> dict:
    text = tmp_path / "notes.txt"
    text.write_text("this is not a checkpoint\n")
    good = tmp_path / "ok.npz"
    np.savez(good, w=np.ones(4096))
    trunc = tmp_path / "trunc.npz"
    trunc.write_bytes(good.read_bytes()[:300])
    nometa = tmp_path / "nometa.npz"
    np.savez(nometa, w=np.ones(3))
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, obj=np.array([{"a": 1}], dtype=object))
    npy = tmp_path / "plain.npy"
    np.save(npy, np.ones(3))
    junkzip = tmp_path / "junk.npz"
    with zipfile.ZipFile(junkzip, "w") as z:
        z.writestr("readme.txt", "hi")
    return {"text": text, "truncated": trunc, "no metadata": nometa, "pickled": pickled, "npy": npy,
            "zip": junkzip}


def test_load_pretrained_rejects_bad_files_with_a_clear_value_error(tmp_path):
    from felixjax.pretrain import load_pretrained

    for kind, path in bad_checkpoints(tmp_path).items():
        with pytest.raises(ValueError, match="not a cost-model checkpoint") as e:
            load_pretrained(path)
        assert str(path) in str(e.value) and "\n" not in str(e.value), kind


@pytest.mark.parametrize("kind", ["text", "truncated", "pickled"])
def test_cli_cost_model_bad_file(kind, tmp_path, capsys):
    path = bad_checkpoints(tmp_path)[kind]
    argv = ["tune", "--op", "matmul:m=8,n=8,k=8", "--strategy", "gradient", "--no-compare", "--trials", "1",
            "--db", str(tmp_path / "t.db"), "--cost-model", str(path)]
    err = one_line_exit_2(argv, capsys, "not a cost-model checkpoint")
    assert "allow_pickle" not in err and "BadZipFile" not in err


def nan_model(path, value=np.nan):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).random((8, 4)).astype(np.float32)
    w[1, 2] = value
    g = helper.make_graph([helper.make_node("Gemm", ["x", "fc.weight"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                          [numpy_helper.from_array(w, "fc.weight")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_are_refused_naming_the_initializer(value, tmp_path):
    path = nan_model(tmp_path / "nan.onnx", value)
    with pytest.raises(fj.UnsupportedModelError, match="layer 'Gemm_0' .* holds 1 NaN/Inf value.* initializer.s. "
                                                       "with NaN/Inf: 'fc.weight'"):
        fj.load_onnx(str(path))


def test_cli_build_on_nan_weights(tmp_path, capsys):
    path = nan_model(tmp_path / "nan.onnx")
    one_line_exit_2(["build", str(path), "-o", str(tmp_path / "out")], capsys, "NaN/Inf: 'fc.weight'")
    assert not (tmp_path / "out").exists()


def test_cli_tune_on_a_foreign_database(tmp_path, capsys):
    db = tmp_path / "notes.db"
    db.write_text("my notes\n")
    one_line_exit_2(["tune", *OP, "--trials", "1", "--db", str(db)], capsys, "not a felixjax database")
    assert db.read_text() == "my notes\n"


def test_quiet_flag_on_tune_compare_build():
    p = _parser()
    assert p.parse_args(["tune", "--op", "matmul:m=8,n=8,k=8", "--quiet"]).quiet
    assert p.parse_args(["compare", "--suite", "ops", "--out", "x", "--quiet"]).quiet
    assert p.parse_args(["build", "m.onnx", "-o", "x", "--quiet"]).quiet
    assert not p.parse_args(["tune", "--op", "matmul:m=8,n=8,k=8"]).quiet


def test_quiet_compare_prints_no_progress(tmp_path, capsys):
    argv = ["compare", "--op", "matmul:m=8,n=8,k=8", "--replay", "--trials", "4", "--seeds", "1",
            "--strategies", "random", "--out", str(tmp_path / "q")]
    assert cli(argv + ["--quiet"]) == 0
    quiet = capsys.readouterr()
    assert quiet.err.strip() == "" and "random" in quiet.out
    assert cli(argv[:-1] + [str(tmp_path / "loud")]) == 0
    assert capsys.readouterr().err.strip() != ""  # without --quiet, progress lines on stderr


def test_more_threads_than_cores_is_a_warning(tmp_path, capsys):
    """Session 72: ``--threads 64`` on a small machine ran without a word."""
    from felixjax.cli import _check_budgets

    many = str((os.cpu_count() or 1) + 1)
    args = _parser().parse_args(["tune", *OP, "--db", str(tmp_path / "t.db"), "--threads", many])
    _check_budgets(args)
    assert "more than this machine's" in capsys.readouterr().err
    args = _parser().parse_args(["tune", *OP, "--db", str(tmp_path / "t.db"), "--threads", "1"])
    _check_budgets(args)
    assert capsys.readouterr().err == ""


def test_an_input_named_twice_is_an_error(tmp_path, capsys):
    """Session 72: a repeated ``--input-shape`` for one input kept the last silently."""
    model = tmp_path / "m.onnx"
    fj.zoo.save("transformer_block", str(model))
    one_line_exit_2(["build", str(model), "-o", str(tmp_path / "b"), "--input-shape", "x=1x8x32",
                     "--input-shape", "x=2x8x32"], capsys, "--input-shape names x more than once")


def test_approx_summary_is_strict_json():
    """Session 72: approx.json held NaN (a point whose time was not measured), which strict parsers reject."""
    import json

    from felixjax.approx.cli import _finite

    got = _finite({"a": float("nan"), "b": [1.0, float("inf"), {"c": 2}], "d": (3, "x")})
    assert got == {"a": None, "b": [1.0, None, {"c": 2}], "d": [3, "x"]}
    json.dumps(got, allow_nan=False)


def test_a_ctrl_c_swallowed_by_a_finalizer_is_sent_again():
    # session 73: Python raises KeyboardInterrupt in whatever runs when SIGINT is handled; inside jax's
    # garbage-collector callback it was printed as "Exception ignored" and dropped: Ctrl-C 0.6-1.0 s after
    # `felixjax tune` started was lost every time. Dropped that way, it is sent again.
    import signal
    import time
    import types

    from felixjax import cli as cli_mod

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), cli_mod._ctrl_c():
            sys.unraisablehook(types.SimpleNamespace(exc_type=KeyboardInterrupt, exc_value=KeyboardInterrupt(),
                                                     exc_traceback=None, err_msg=None, object=None))
            time.sleep(5)  # the signal sent again lands here
    finally:
        signal.signal(signal.SIGINT, old)


def test_import_and_help_load_neither_jax_nor_onnx():
    # session 73: `import felixjax` loaded jax, flax and onnx (2 s), so `felixjax --help` took 3 s and a
    # Ctrl-C in that time was a traceback; the public names load on first use and stay the same objects
    code = ("import sys, felixjax as fj\n"
            "from felixjax.cli import _parser\n"
            "_parser()\n"
            "assert not {'jax', 'onnx', 'flax'} & set(sys.modules), sorted({'jax', 'onnx', 'flax'} & set(sys.modules))\n"
            "import felixjax.compare, felixjax.sparsify, felixjax.strategies.genetic\n"
            "assert callable(fj.compare) and callable(fj.sparsify) and 'genetic' in fj.strategies()\n"
            "from felixjax import tune, Target, Database\n"
            "assert fj.tune is tune and set(fj.__all__) <= set(dir(fj))\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_cost_model_with_nan_weights_or_of_another_class_is_refused(tmp_path):
    # session 75 (a user's review): a checkpoint of NaN weights loaded and ranked every candidate NaN, silently; a
    # model of another class (costmodels.CostModel protocol) failed with "'Linear' object has no attribute
    # 'n_access_features'"; a genetic scorer giving only NaN ran without a word
    import jax

    import felixjax as fj
    from costmodels import RooflineModel
    from felixjax.model import load_pretrained
    from felixjax.strategies.genetic import GeneticSearch
    from felixjax.testing import ReplayRunner

    model = load_pretrained("packaged")
    model.params = jax.tree_util.tree_map(lambda a: np.where(np.arange(np.size(a)).reshape(np.shape(a)) == 0,
                                                             np.nan, a), model.params)
    model.save(tmp_path / "nan.npz")

    def replay(t, tg):
        return ReplayRunner.from_oracle(t, tg)

    for cm in (str(tmp_path / "nan.npz"), model):
        with pytest.raises(ValueError, match="holds [0-9]+ NaN/Inf weight"):
            fj.tune("matmul:m=32,n=32,k=32", strategy="gradient", trials=4, progress=False, retime=0,
                    measurer=replay, cost_model=cm)
    with pytest.raises(TypeError, match="cost_model takes a checkpoint path .* not RooflineModel"):
        fj.tune("matmul:m=32,n=32,k=32", strategy="genetic", trials=4, progress=False, retime=0, measurer=replay,
                cost_model=RooflineModel(flops_col=0, bytes_col=1, peak_flops=1e11, bandwidth=1e10))

    class NaNScorer:
        def score(self, configs):
            return np.full(len(configs), np.nan)

        def update(self, records):
            pass

    with pytest.warns(RuntimeWarning, match="scorer NaNScorer gave no finite score"):
        fj.tune("matmul:m=32,n=32,k=32", strategy=GeneticSearch(scorer=NaNScorer(), batch_size=8, population=32),
                trials=8, progress=False, retime=0, measurer=replay)


def test_cli_plugin_registers_a_strategy(tmp_path, monkeypatch, capsys):
    # session 75 (a user's review): the CLI knew only the built-in strategies
    import sys

    from felixjax.strategies.base import _REGISTRY

    (tmp_path / "fj_plug_s75.py").write_text(
        "from felixjax.strategies import register\n"
        "from felixjax.strategies.random import RandomSearch\n\n\n"
        "@register('plugged')\n"
        "class Plugged(RandomSearch):\n"
        "    name = 'plugged'\n")
    monkeypatch.chdir(tmp_path)
    try:
        argv = ["--plugin", "fj_plug_s75", "tune", "--op", "matmul:m=8,n=8,k=8", "--strategy", "plugged",
                "--no-compare", "--trials", "2", "--db", str(tmp_path / "p.db")]
        assert cli(argv) == 0
        capsys.readouterr()
        with fj.Database(str(tmp_path / "p.db")) as db:
            assert db.runs() == ["plugged:0"]
        one_line_exit_2(["--plugin", "no_such_fj_plugin", "tune", *OP, "--trials", "1"], capsys,
                        "--plugin no_such_fj_plugin: no such module")
    finally:
        _REGISTRY.pop("plugged", None)
        sys.modules.pop("fj_plug_s75", None)


def test_ctrl_c_says_whether_anything_was_kept(tmp_path, monkeypatch, capsys):
    # session 75 (a user's review): `felixjax approx` without --db keeps its measurements in memory, yet Ctrl-C said
    # "every measurement so far is in the database"
    from felixjax import cli as cli_mod

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli_mod.COMMANDS, "approx", interrupted)
    model = str(tmp_path / "m.onnx")
    assert cli(["approx", model, "--data", "d.npz", "-o", str(tmp_path / "out")]) == 130
    assert "interrupted; nothing was kept: without --db" in capsys.readouterr().err
    out = str(tmp_path / "out")
    assert cli(["approx", model, "--data", "d.npz", "-o", out, "--db", str(tmp_path / "a.db")]) == 130
    assert "interrupted; every measurement so far is in the database" in capsys.readouterr().err


def test_an_error_message_never_carries_terminal_escapes(capsys):
    # session 76 (a security review): ONNX shape inference's message quoted a node name with its escape sequences
    # (a window title, the clipboard) straight to the terminal; every error is printed escaped
    err = one_line_exit_2(["report", "\x1b]0;PWNED\x07.db"], capsys, "PWNED")  # "PATH: no such database"
    assert "\x1b" not in err and "\x07" not in err and "\\x1b" in err


def test_version_is_the_installed_distributions(capsys):
    # session 78 (a packaging review): `felixjax --version` was a usage error and the version was written twice
    from importlib import metadata

    with pytest.raises(SystemExit) as e:
        cli(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"felixjax {metadata.version('felixjax')}\n"
    assert fj.__version__ == metadata.version("felixjax")


def test_dask_entry_points_name_the_extra_where_distributed_is_missing(monkeypatch):
    # session 78 (a packaging review): local_cluster() raised a bare ModuleNotFoundError in a base install
    from felixjax import dask_runner

    monkeypatch.setitem(sys.modules, "distributed", None)  # what a base install without the dask extra has
    with pytest.raises(ImportError, match=r"local_cluster\(\) needs dask.distributed: pip install 'felixjax\[dask\]'"):
        dask_runner.local_cluster()
    with pytest.raises(ImportError, match=r"connect\(\) needs dask.distributed: pip install 'felixjax\[dask\]'"), \
            dask_runner.connect("local"):
        pass
