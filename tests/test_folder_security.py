"""Model folders from strangers: no file outside IN and OUT is read or written, nothing blocks or never ends.

Each case is a folder a malicious or broken source could hand over (an index naming paths that
climb out of it, links through folders, FIFOs and devices, loops, configs built to make a
parser or a regular expression run forever); every entry point (``aq.load``, ``quantize``,
``dequantize``, ``inspect``, the command line) must refuse it with a typed error before it
writes anything, or handle it within bounds. Sentinel files beside IN and above OUT must come
through every case unchanged. Cases that would hang on a regression run in a subprocess with a
time limit.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import arrayquant as aq
from arrayquant.cli import main
from arrayquant.errors import CorruptDataError, SchemeError, ShapeError
from arrayquant.io.arrayquant.checkpoint import save_stream
from arrayquant.io.compressed_tensors.model import dequantize_model, load_model
from arrayquant.io.compressed_tensors.requantize import quantize_model
from arrayquant.io.safetensors.reader import SafetensorsFile

pytest.importorskip("ml_dtypes")

INDEX = "model.safetensors.index.json"


def _w(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)


def _folder(path: Path, shards: dict[str, dict[str, np.ndarray]], weight_map: dict[str, str] | None = None) -> Path:
    """A model folder with these shards and an index mapping each tensor to its shard (or ``weight_map``)."""
    path.mkdir(parents=True, exist_ok=True)
    for shard, tensors in shards.items():
        save_stream(path / shard, iter(tensors.items()), metadata={"format": "pt"}, plain=True)
    mapping = {n: s for s, tensors in shards.items() for n in tensors} if weight_map is None else weight_map
    (path / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": mapping}))
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 96}))
    return path


class Sentinels:
    """Files outside IN and OUT whose bytes and times must survive a case."""

    def __init__(self, *paths: Path) -> None:
        self.paths = paths
        for p in paths:
            p.parent.mkdir(parents=True, exist_ok=True)
            save_stream(p, iter([("x", _w(2, 4, 9))]), metadata={"format": "pt"})
        self.before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in paths}

    def unchanged(self) -> bool:
        return all((p.read_bytes(), p.stat().st_mtime_ns) == self.before[p] for p in self.paths)


def _entry_points(src: Path, out: Path) -> list[tuple[str, object]]:
    """Every way a folder is read: the library's and the command line's."""
    return [
        ("aq.load", lambda: aq.load(src)),
        ("load_model", lambda: load_model(src)),
        ("quantize_model", lambda: quantize_model(src, out, "mxfp8")),
        ("dequantize_model", lambda: dequantize_model(src, out)),
    ]


def _refused_everywhere(src: Path, out: Path, capsys: pytest.CaptureFixture[str], match: str) -> None:
    for what, call in _entry_points(src, out):
        with pytest.raises(CorruptDataError, match=match):
            call()  # type: ignore[operator]
        assert not out.exists(), what
    for argv in (["inspect", str(src)], ["dequantize", str(src), str(out)], ["quantize", str(src), str(out)]):
        extra = ["--scheme", "mxfp8", "--quiet"] if argv[0] == "quantize" else []
        capsys.readouterr()
        assert main([*argv, *extra]) == 1, argv
        err = capsys.readouterr().err
        assert "arrayquant: error: CorruptDataError" in err, (argv, err)
        assert not out.exists(), argv


# ---------------------------------------------------------------------------------------------
# 1. shard names
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["../victim.safetensors", "ABSOLUTE", "sub/../model-1.safetensors", "./model-1.safetensors", "..", "a\\b"],
)
def test_a_shard_name_that_leaves_the_folder_is_refused(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    guard = Sentinels(tmp_path / "victim.safetensors", tmp_path / "abs" / "target.safetensors")
    src = tmp_path / "m"
    if name == "ABSOLUTE":
        name = str(tmp_path / "abs" / "target.safetensors")
    (src / "sub").mkdir(parents=True)
    _folder(src, {"model-1.safetensors": {"a.q_proj.weight": _w(64, 64)}}, {"a.q_proj.weight": name})
    _refused_everywhere(src, tmp_path / "q", capsys, r"names the shard .*(without folders|not a \.safetensors)")
    assert guard.unchanged()


def test_a_shard_name_through_a_linked_folder_cannot_write_above_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The audit's case: ``lnk -> a/b/c`` and ``lnk/../../../notes.txt``, which wrote two levels above OUT."""
    base = tmp_path / "work" / "deep"
    guard = Sentinels(base / "notes.txt", tmp_path / "work" / "notes.txt", tmp_path / "notes.txt")
    src = base / "m"
    (src / "a" / "b" / "c").mkdir(parents=True)
    (src / "lnk").symlink_to("a/b/c")
    save_stream(src / "notes.txt", iter([("a.q_proj.weight", _w(64, 64))]), metadata={"format": "pt"})
    _folder(src, {}, {"a.q_proj.weight": "lnk/../../../notes.txt"})
    _refused_everywhere(src, base / "out" / "q", capsys, "without folders")
    assert guard.unchanged()


@pytest.mark.parametrize("kind", ["nul", "surrogate", "folder", "fifo", "device", "missing", "loop", "empty", "int"])
def test_a_shard_that_is_not_a_regular_file_of_the_folder_is_refused(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "m"
    src.mkdir()
    name: object = {"nul": "x\x00.safetensors", "surrogate": "\ud800.safetensors", "empty": "", "int": 7}.get(
        kind, f"{kind}.safetensors"
    )
    if kind == "folder":
        (src / "folder.safetensors").mkdir()
    elif kind == "fifo":
        os.mkfifo(src / "fifo.safetensors")
    elif kind == "device":
        (src / "device.safetensors").symlink_to("/dev/zero")
    elif kind == "loop":
        (src / "loop.safetensors").symlink_to("loop.safetensors")
    save_stream(src / "model.safetensors", iter([("b.q_proj.weight", _w(64, 64))]), metadata={"format": "pt"})
    (src / INDEX).write_text(json.dumps({"weight_map": {"a.q_proj.weight": name, "b": "model.safetensors"}}))
    (src / "config.json").write_text("{}")
    why = {
        "nul": "NUL or an invalid character",
        "surrogate": "NUL or an invalid character",
        "folder": "which is a folder",
        "fifo": "which is a FIFO",
        "device": "which is a character device",
        "missing": "cannot be read: No such file",
        "loop": "cannot be read: Too many levels of symbolic links",
        "empty": "which is not a file name",
        "int": "which is not a file name",
    }[kind]
    _refused_everywhere(src, tmp_path / "q", capsys, why)


def test_a_shard_linked_to_a_file_outside_the_folder_is_refused(tmp_path: Path) -> None:
    guard = Sentinels(tmp_path / "private" / "other.safetensors")
    src = _folder(tmp_path / "m", {"model.safetensors": {"a.q_proj.weight": _w(64, 64)}})
    (src / "model.safetensors").unlink()
    (src / "model.safetensors").symlink_to(tmp_path / "private" / "other.safetensors")
    with pytest.raises(CorruptDataError, match="a link to a file outside the folder"):
        aq.load(src)
    with pytest.raises(CorruptDataError, match="a link to a file outside the folder"):
        quantize_model(src, tmp_path / "q", "mxfp8")
    assert guard.unchanged()
    assert not (tmp_path / "q").exists()


def test_a_hugging_face_cache_snapshot_is_read_through_its_links(tmp_path: Path) -> None:
    """The cache keeps a snapshot's files as links into the model's ``blobs``: those are the folder's own."""
    repo = tmp_path / "hub" / "models--org--tiny"
    snap, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    blobs.mkdir(parents=True)
    w = _w(64, 64)
    save_stream(blobs / "b1", iter([("a.q_proj.weight", w)]), metadata={"format": "pt"})
    (blobs / "b2").write_text(json.dumps({"model_type": "llama"}))
    (blobs / "b3").write_text('{"tok": 1}')
    snap.mkdir(parents=True)
    for name, blob in (("model.safetensors", "b1"), ("config.json", "b2"), ("tokenizer.json", "b3")):
        (snap / name).symlink_to(Path("..", "..", "blobs", blob))
    np.testing.assert_array_equal(aq.load(snap)["a.q_proj.weight"], w)
    summary = quantize_model(snap, tmp_path / "q", "mxfp8")
    assert summary.quantized == ["a.q_proj"]
    copied = tmp_path / "q" / "tokenizer.json"
    assert not copied.is_symlink()
    assert copied.read_text() == '{"tok": 1}'


def test_output_names_come_only_from_checked_shard_names(tmp_path: Path) -> None:
    """A valid sharded folder still writes its shards under their own names, and nothing else."""
    src = _folder(
        tmp_path / "m",
        {
            "model-00001-of-00002.safetensors": {"a.q_proj.weight": _w(64, 64, 1)},
            "model-00002-of-00002.safetensors": {"b.norm.weight": _w(1, 64)[0]},
        },
    )
    quantize_model(src, tmp_path / "q", "mxfp8")
    assert sorted(p.name for p in (tmp_path / "q").iterdir()) == [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        INDEX,
    ]


# ---------------------------------------------------------------------------------------------
# 2. files that never open or never end
# ---------------------------------------------------------------------------------------------


def _run(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter: a regression that hangs fails the test instead of the suite."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_a_fifo_in_the_index_does_not_hang_load(tmp_path: Path) -> None:
    src = _folder(tmp_path / "m", {"model.safetensors": {"a.q_proj.weight": _w(64, 64)}})
    os.mkfifo(src / "pipe.safetensors")
    (src / INDEX).write_text(json.dumps({"weight_map": {"a.q_proj.weight": "pipe.safetensors"}}))
    res = _run(
        f"""
        import arrayquant as aq
        try:
            aq.load({str(src)!r})
        except aq.CorruptDataError as exc:
            print("refused:", exc)
        """,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    assert "which is a FIFO, not a .safetensors file" in res.stdout


def test_a_fifo_named_as_the_file_to_read_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "w.safetensors")
    res = _run(
        f"""
        import arrayquant as aq
        try:
            aq.load({str(tmp_path / "w.safetensors")!r})
        except aq.CorruptDataError as exc:
            print("refused:", exc)
        """,
        timeout=30,
    )
    assert "is a FIFO, not a regular file" in res.stdout, res.stderr


def test_other_files_are_copied_only_when_regular(tmp_path: Path) -> None:
    """``tokenizer.json -> /dev/zero`` once copied without end; FIFOs blocked; loops recursed."""
    src = _folder(tmp_path / "m", {"model.safetensors": {"a.q_proj.weight": _w(64, 64)}})
    (src / "tokenizer.json").symlink_to("/dev/zero")
    os.mkfifo(src / "pipe.txt")
    (src / "dangling.txt").symlink_to(tmp_path / "nowhere")
    (src / "self.txt").symlink_to("self.txt")
    (src / "sub").mkdir()
    (src / "sub" / "loop").symlink_to("..")  # a folder that contains itself
    (src / "sub" / "ok.txt").write_text("kept")
    (tmp_path / "outside.json").write_text('{"kept": true}')
    (src / "special_tokens_map.json").symlink_to(tmp_path / "outside.json")
    (src / "status").symlink_to("/proc/self/status")  # a regular file whose size reads as 0
    out = tmp_path / "q"
    res = _run(
        f"""
        from arrayquant.io.compressed_tensors.requantize import quantize_model
        s = quantize_model({str(src)!r}, {str(out)!r}, "mxfp8")
        print(sorted(s.copied_files))
        print(sorted(s.refused_files.items()))
        """,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    copied, refused = res.stdout.splitlines()
    assert copied == str(["special_tokens_map.json", "status", "sub"])
    assert refused == str(
        sorted(
            {
                "dangling.txt": "No such file or directory",
                "pipe.txt": "a FIFO, not a regular file",
                "self.txt": "Too many levels of symbolic links",
                "sub/loop": "a link back to a folder that contains it",
                "tokenizer.json": "a character device, not a regular file",
            }.items()
        )
    )
    assert (out / "special_tokens_map.json").read_text() == '{"kept": true}'
    assert not (out / "special_tokens_map.json").is_symlink()
    assert (out / "sub" / "ok.txt").read_text() == "kept"
    assert (out / "status").stat().st_size == 0  # bounded by the size seen when the copy started
    assert not (out / "tokenizer.json").exists()
    assert not (out / "sub" / "loop").exists()


def test_the_command_names_what_it_did_not_copy_in_short_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _folder(tmp_path / "m", {"model.safetensors": {"a.q_proj.weight": _w(64, 64)}})
    (src / "sub").mkdir()
    (src / "sub" / "loop").symlink_to("..")
    (src / "x").symlink_to("x")
    assert main(["quantize", str(src), str(tmp_path / "q"), "--scheme", "mxfp8", "--quiet"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("not copied")]
    assert lines == [
        "not copied: sub/loop (a link back to a folder that contains it)",
        "not copied: x (Too many levels of symbolic links)",
    ]


# ---------------------------------------------------------------------------------------------
# 3. a GGUF or Burnpack file as its own OUT
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".gguf", ".bpk"])
@pytest.mark.parametrize("link", ["same", "symlink", "hardlink", "dotted"])
def test_a_file_given_as_its_own_out_is_refused(
    suffix: str, link: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("gguf" if suffix == ".gguf" else "cbor2")
    src = tmp_path / f"m{suffix}"
    aq.save(src, {"blk.0.attn_q.weight": _w(64, 64)})
    before = src.read_bytes()
    out = {
        "same": src,
        "symlink": tmp_path / f"link{suffix}",
        "hardlink": tmp_path / f"hard{suffix}",
        "dotted": tmp_path / "." / src.name,
    }[link]
    if link == "symlink":
        out.symlink_to(src)
    elif link == "hardlink":
        os.link(src, out)
    scheme = "q8_0" if suffix == ".gguf" else "q8s"
    assert main(["quantize", str(src), str(out), "--scheme", scheme, "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"OUT {out} is the same file as IN {src}; writing it would replace the input" in err
    assert src.read_bytes() == before


# ---------------------------------------------------------------------------------------------
# 5, 9, 10. configs
# ---------------------------------------------------------------------------------------------


def _two_groups(src: Path, targets: list[str], ignore: list[str] | None = None) -> None:
    """Give a quantized folder a second config group, so a module is matched to its group by name."""
    config = json.loads((src / "config.json").read_text())
    qc = config["quantization_config"]
    group = next(iter(qc["config_groups"].values()))
    qc["config_groups"] = {"group_0": {**group, "targets": targets}, "group_1": {**group, "targets": ["re:^nothing$"]}}
    if ignore is not None:
        qc["ignore"] = ignore
    (src / "config.json").write_text(json.dumps(config))


@pytest.fixture
def quantized_folder(tmp_path: Path) -> Path:
    src = _folder(tmp_path / "m", {"model.safetensors": {"model.layers.0.self_attn.q_proj.weight": _w(64, 64)}})
    quantize_model(src, tmp_path / "q", "mxfp8")
    return tmp_path / "q"


def test_a_catastrophic_config_pattern_is_matched_in_bounded_time(quantized_folder: Path) -> None:
    _two_groups(quantized_folder, ["re:(.*.*)*!", "re:.*q_proj$"])
    res = _run(
        f"""
        import time, arrayquant as aq
        t = time.perf_counter()
        out = aq.load({str(quantized_folder)!r})
        print(type(out["model.layers.0.self_attn.q_proj.weight"]).__name__, time.perf_counter() - t)
        """,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    kind, seconds = res.stdout.split()
    assert kind == "QuantizedTensor"
    assert float(seconds) < 5


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("re:(", "is not a regular expression: missing \\), unterminated subpattern"),
        ("re:(a)\\1", "uses what arrayquant does not match"),
        ("re:(?=x).*", "uses what arrayquant does not match"),
        ("re:" + "a" * 5000, "more than 4096 characters"),
        ("re:a{50000}", "more than 20000 automaton states"),
    ],
    ids=["unparsed", "backreference", "lookahead", "long", "huge-repeat"],
)
@pytest.mark.parametrize("where", ["targets", "ignore"])
def test_a_broken_config_pattern_is_a_typed_error(quantized_folder: Path, pattern: str, why: str, where: str) -> None:
    if where == "targets":
        _two_groups(quantized_folder, [pattern])
    else:
        _two_groups(quantized_folder, ["re:.*q_proj$"], ignore=["lm_head", pattern])
    with pytest.raises(CorruptDataError, match=f"the config pattern .*{why}"):
        aq.load(quantized_folder)


def test_patterns_match_as_python_re_match_does() -> None:
    """The bounded matcher against ``re.match`` itself on the patterns configs use, and random names."""
    import random

    from arrayquant.io.patterns import matches

    patterns = [
        r".*self_attn\.(q|k|v)_proj$",
        r"model\.layers\.\d+\.mlp\.(gate|up)_proj",
        r"^lm_head$",
        r"a{2,4}b?",
        r"[^.]+\.[a-z_]+",
        r"x*?y",
        r"(ab|a)*c$",
        r"\w+\s*\d{0,3}$",
        r"",
        r"a|",
        r"[a-c\d_]*\.$",
        r"(.+)+z",
    ]
    rng = random.Random(0)
    names = ["model.layers.0.self_attn.k_proj", "model.layers.12.mlp.gate_proj", "lm_head", "lm_head\n", "aaab"]
    names += ["".join(rng.choice("ab.c_1 xyz\n") for _ in range(rng.randint(0, 9))) for _ in range(1500)]
    for p in patterns:
        for n in names:
            if p == r"(.+)+z" and len(n) > 16:  # re itself backtracks 2**len(n) steps there (minutes at 30)
                assert not matches("re:" + p, n)
                continue
            assert matches("re:" + p, n) == (re.match(p, n) is not None), (p, n)


def test_a_config_nested_too_deep_is_a_typed_error(tmp_path: Path) -> None:
    src = _folder(tmp_path / "m", {"model.safetensors": {"a.q_proj.weight": _w(64, 64)}})
    (src / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CorruptDataError, match=r"config.json is not JSON arrayquant can read .*nested too deep"):
        aq.load(src)
    with pytest.raises(CorruptDataError, match="nested too deep"):
        quantize_model(src, tmp_path / "q", "mxfp8")
    # a plain safetensors file beside it is read by itself: the config describes nothing it can use
    lone = tmp_path / "m" / "lone.safetensors"
    aq.save(lone, {"w": _w(2, 4)})
    np.testing.assert_array_equal(aq.load(lone)["w"], _w(2, 4))


def test_an_index_nested_too_deep_or_too_large_is_a_typed_error(tmp_path: Path) -> None:
    src = _folder(tmp_path / "m", {"model.safetensors": {"a.q_proj.weight": _w(64, 64)}})
    (src / INDEX).write_text('{"weight_map": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(CorruptDataError, match="nested too deep"):
        aq.load(src)
    with (src / INDEX).open("w") as f:
        f.write('{"weight_map": {"a": "model.safetensors"}, "pad": "')
        f.write("x" * (65 * 2**20))
        f.write('"}')
    with pytest.raises(CorruptDataError, match="larger than 64 MiB, too large for a safetensors index"):
        aq.load(src)


@pytest.mark.parametrize("bits", [[], {}, None, "4", 4.0, True, -1, 2**70])
def test_odd_num_bits_in_a_pack_quantized_group_is_a_typed_error(tmp_path: Path, bits: object) -> None:
    src = _folder(tmp_path / "m", {"model.safetensors": {"a.q_proj.weight": _w(64, 64)}})
    quantize_model(src, tmp_path / "q", "q4s:block32:bf16:native")
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    next(iter(config["quantization_config"]["config_groups"].values()))["weights"]["num_bits"] = bits
    (tmp_path / "q" / "config.json").write_text(json.dumps(config))
    with pytest.raises(SchemeError, match=re.escape(f"with {bits!r} bits do not map")):
        aq.load(tmp_path / "q")


@pytest.mark.parametrize(("scheme", "codes"), [("mxfp8", "F8_E4M3"), ("e4m3:tensor:f32:native", "F8_E4M3")])
def test_a_quantized_weight_without_its_scale_is_refused(quantized_folder: Path, scheme: str, codes: str) -> None:
    """Deleting ``weight_scale`` once loaded the raw codes as the weight, without an error."""
    src = quantized_folder.parent / "m"
    out = quantized_folder.parent / f"q-{scheme.replace(':', '-')}"
    quantize_model(src, out, scheme)
    path = out / "model.safetensors"
    with SafetensorsFile(path) as st:
        raw = {k: st.array(k) for k in st.entries if not k.endswith("weight_scale")}
    path.unlink()
    save_stream(path, iter(raw.items()), metadata={"format": "pt"})
    with pytest.raises(CorruptDataError, match=f"stores .*q_proj.weight' as {codes}, the codes of a quantized weight"):
        aq.load(out)
    with pytest.raises(CorruptDataError, match=r"no 'model\.layers\.0\.self_attn\.q_proj\.weight_scale'"):
        dequantize_model(out, quantized_folder.parent / "f")


# ---------------------------------------------------------------------------------------------
# 7. thousands of shards
# ---------------------------------------------------------------------------------------------


def test_a_folder_of_more_shards_than_open_files_is_read_and_written(tmp_path: Path) -> None:
    """With the open-file limit at 128, a folder of 300 shards loads, quantizes and dequantizes."""
    shards = {
        f"model-{k:05d}-of-00300.safetensors": {f"layers.{k}.mlp.up_proj.weight": _w(32, 32, k)} for k in range(300)
    }
    src = _folder(tmp_path / "m", shards)
    res = _run(
        f"""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
        import numpy as np, arrayquant as aq
        from arrayquant.io.compressed_tensors.model import dequantize_model
        from arrayquant.io.compressed_tensors.requantize import quantize_model
        loaded = aq.load({str(src)!r})
        s = quantize_model({str(src)!r}, {str(tmp_path / "q")!r}, "mxfp8")
        q = aq.load({str(tmp_path / "q")!r})
        dequantize_model({str(tmp_path / "q")!r}, {str(tmp_path / "f")!r})
        f = aq.load({str(tmp_path / "f")!r})
        k = "layers.7.mlp.up_proj.weight"
        same = np.array_equal(np.asarray(aq.dequantize(q[k])), f[k])
        print(len(loaded), len(s.quantized), len(q), len(f), same)
        """,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["300", "300", "300", "300", "True"]


def test_a_file_that_changes_between_reads_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard released by the open-file pool is opened again only if it is still the same file."""
    from arrayquant.io.safetensors import reader

    monkeypatch.setattr(reader._OpenFiles, "limit", 1)
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    aq.save(a, {"x": _w(2, 4)})
    aq.save(b, {"y": _w(2, 4)})
    with reader.SafetensorsFile(a) as fa, reader.SafetensorsFile(b) as fb:
        np.testing.assert_array_equal(fa.array("x"), _w(2, 4))
        fb.array("y")  # releases a
        assert fa._file is None
        np.testing.assert_array_equal(fa.array("x"), _w(2, 4))  # opened again
        fb.array("y")
        aq.save(a, {"x": _w(3, 4)})
        with pytest.raises(CorruptDataError, match="changed while it was read; read it again"):
            fa.array("x")


# ---------------------------------------------------------------------------------------------
# 11. Ctrl-C while the command starts
# ---------------------------------------------------------------------------------------------


def test_ctrl_c_while_the_command_loads_exits_130_quietly() -> None:
    script = Path(sys.executable).parent / "arrayquant"
    if not script.exists():
        pytest.skip("the arrayquant command is not installed beside this Python")
    proc = subprocess.Popen([str(script), "backends"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.12)  # Python is up; NumPy and the package are still loading
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, (proc.returncode, err)
    assert "Traceback" not in err
    assert err.strip() == "arrayquant: interrupted"


# ---------------------------------------------------------------------------------------------
# the helpers' own error paths
# ---------------------------------------------------------------------------------------------


def test_open_regular_refuses_folders_and_devices_and_read_json_fifos(tmp_path: Path) -> None:
    from arrayquant.io.paths import open_regular, read_json

    with pytest.raises(IsADirectoryError):
        open_regular(tmp_path)
    with pytest.raises(CorruptDataError, match="/dev/null is a character device, not a regular file"):
        open_regular("/dev/null")
    os.mkfifo(tmp_path / "config.json")
    with pytest.raises(CorruptDataError, match="is a FIFO, not a regular file"):
        read_json(tmp_path / "config.json", "a model config")
    (tmp_path / "bad.json").write_bytes(b"\xff{}")
    with pytest.raises(CorruptDataError, match=r"bad.json is not JSON \(an index\)"):
        read_json(tmp_path / "bad.json", "an index")


def test_a_match_over_its_step_budget_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from arrayquant.io import patterns

    monkeypatch.setattr(patterns, "MAX_STEPS", 3)
    with pytest.raises(CorruptDataError, match=r"matching the config pattern 're:\(a\|b\)\*cd' .* costs too much"):
        patterns.matches("re:(a|b)*cd", "ab" * 100)


def test_a_closed_file_is_not_read_again(tmp_path: Path) -> None:
    aq.save(tmp_path / "a.safetensors", {"x": _w(2, 4)})
    st = SafetensorsFile(tmp_path / "a.safetensors")
    st.close()
    with pytest.raises(ValueError, match=r"a\.safetensors was closed"):
        st.array("x")


# ---------------------------------------------------------------------------------------------
# cases the folder fuzz target found
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["folder", "loop", "dangling"])
@pytest.mark.parametrize("name", ["config.json", INDEX])
def test_a_config_or_index_that_is_not_a_readable_file_is_a_typed_error(tmp_path: Path, kind: str, name: str) -> None:
    src = _folder(tmp_path / "m", {"model.safetensors": {"a.q_proj.weight": _w(64, 64)}})
    (src / name).unlink()
    if kind == "folder":
        (src / name).mkdir()
    elif kind == "loop":
        (src / name).symlink_to(name)
    else:
        (src / name).symlink_to(tmp_path / "nowhere.json")
    why = {"folder": "Is a directory", "loop": "Too many levels of symbolic links", "dangling": "No such file"}[kind]
    with pytest.raises(CorruptDataError, match=f"{re.escape(name)} cannot be read as .*: {why}"):
        aq.load(src)


@pytest.mark.parametrize("value", [{"a": 1}, ["x"], None, 3.5])
def test_an_index_whose_shard_names_are_not_strings_is_a_typed_error(tmp_path: Path, value: object) -> None:
    src = _folder(tmp_path / "m", {"model.safetensors": {"a.q_proj.weight": _w(64, 64)}})
    (src / INDEX).write_text(json.dumps({"weight_map": {"a.q_proj.weight": value}}))
    with pytest.raises(CorruptDataError, match="which is not a file name"):
        aq.load(src)


def test_a_link_to_a_folder_outside_in_is_not_followed(tmp_path: Path) -> None:
    """A link to the folder holding IN once made the copy descend into OUT as it was written."""
    src = _folder(tmp_path / "case" / "m", {"model.safetensors": {"a.q_proj.weight": _w(64, 64)}})
    (src / "d").mkdir()
    (src / "d" / "root").symlink_to(tmp_path / "case")
    out = tmp_path / "case" / "o" / "q"
    summary = quantize_model(src, out, "mxfp8")
    assert summary.refused_files == {"d/root": "a link to a folder outside the model's folder"}
    assert sorted(p.name for p in (out / "d").iterdir()) == []
    dequantize_model(out, tmp_path / "case" / "o" / "f")


def test_tensor_names_arrayquant_reserves_for_its_own_layout_pass_through_model_folders(tmp_path: Path) -> None:
    """A model folder is plain safetensors: names such as ``x.scales`` are kept, not refused."""
    names = {"a.q_proj.weight": _w(64, 64), "b.scales": _w(1, 4)[0], "c.weight_scale.global_scale": _w(1, 2)[0]}
    src = _folder(tmp_path / "m", {"model.safetensors": names})
    quantize_model(src, tmp_path / "q", "nvfp4")
    dequantize_model(tmp_path / "q", tmp_path / "f")
    back = aq.load(tmp_path / "f")
    for name in ("b.scales", "c.weight_scale.global_scale"):
        np.testing.assert_array_equal(back[name], names[name])


def test_inspect_shows_a_config_that_is_not_unicode(quantized_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = json.loads((quantized_folder / "config.json").read_text())
    group = next(iter(config["quantization_config"]["config_groups"].values()))
    group["input_activations"] = {"type": "\ud800", "num_bits": 8, "strategy": "token", "dynamic": True}
    (quantized_folder / "config.json").write_text(json.dumps(config))
    assert main(["inspect", str(quantized_folder)]) == 0
    assert "input activations \\ud800 8-bit" in capsys.readouterr().out


def test_a_plain_file_holds_arrays_under_any_name_but_the_header_key(tmp_path: Path) -> None:
    qt = aq.quantize(_w(2, 32), "q8s")
    with pytest.raises(ShapeError, match="tensor 'w' is quantized; a plain safetensors file holds arrays only"):
        save_stream(tmp_path / "a.safetensors", iter([("w", qt)]), plain=True)
    for plain in (True, False):
        with pytest.raises(ShapeError, match="tensor name '__metadata__' is not allowed"):
            save_stream(tmp_path / "b.safetensors", iter([("__metadata__", _w(1, 2))]), plain=plain)
    assert not list(tmp_path.iterdir())


def test_each_shard_name_of_a_large_index_is_checked_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An index maps thousands of tensors to a few shards: checking every entry cost seconds."""
    from arrayquant.io.compressed_tensors import folder as ct_folder

    src = _folder(tmp_path / "m", {"model.safetensors": {"a.q_proj.weight": _w(64, 64)}})
    mapping = {f"t{i}": "model.safetensors" for i in range(50_000)}
    (src / INDEX).write_text(json.dumps({"weight_map": mapping}))
    calls: list[object] = []
    checked = ct_folder.shard_name
    monkeypatch.setattr(ct_folder, "shard_name", lambda f, n, i: calls.append(n) or checked(f, n, i))
    assert ct_folder.weight_files(src) == (["model.safetensors"], True)
    assert calls == ["model.safetensors"]
