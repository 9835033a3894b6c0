"""Hostile and edge-case calls: each raises a Python exception of the stated
type with a fragment of the stated message, and none kills the interpreter.

The calls run in a child interpreter, one after the other, under an address
space limit, so that a crash (a signal, an abort on a failed allocation)
fails the test naming the case instead of ending the test run. Each row is
(name, expected exception type, message fragment, code); the code runs with
``np``, ``sg`` and, for the torch rows, ``torch`` and ``st``
(``splitgrad.torch``) in scope.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

NUMPY_CASES = [
    ("table of 10^12 rows", "MemoryError", "token_embedding.orig.weight",
     'sg.SplitTokenEmbeddings({"orig": 10**12}, ["orig"], 1024)'),
    ("hidden size of 10^11", "MemoryError", "token_embedding.orig.weight",
     'sg.SplitTokenEmbeddings({"orig": 10}, ["orig"], 10**11)'),
    ("a size no machine holds", "ValueError", "16.0 EiB",
     'sg.SplitTokenEmbeddings({"orig": 2**62}, ["orig"], 2**20)'),
    ("split sizes that overflow their sum", "ValueError", "",
     'sg.SplitTokenEmbeddings({"a": 2**63 - 1, "b": 2**63 - 1}, ["a", "b"], 1)'),
    ("head over 10^11 tokens", "MemoryError", "lm_head.orig.weight",
     'sg.SplitLanguageModellingHead({"orig": 10**11}, ["orig"], 8)'),
    ("vocabulary of 10^12 tokens (nothing V-sized is held)", None, "",
     'v = sg.SplitVocabulary(np.array([0]), np.array([10**12 - 1]), 10**12, 8, 2)\n'
     'v.forward(np.array([10**12 - 1, 5]), np.array([0, 1]), np.ones((2, 8), np.float32))'),
    ("vocabulary rows 10^11 wide", "MemoryError", "split_vocabulary.rows",
     'sg.SplitVocabulary(np.array([0]), np.array([1]), 10, 10**11, 2)'),
    ("forward over a broadcast view of 10^10 ids", "MemoryError", "input_ids",
     'e = sg.SplitTokenEmbeddings({"orig": 4}, ["orig"], 2)\n'
     'e.forward(np.broadcast_to(np.zeros(1, np.int64), (10**10,)))'),
    ("backward over a broadcast gradient of 10^10 rows", "MemoryError", "",
     'e = sg.SplitTokenEmbeddings({"orig": 4}, ["orig"], 2)\n'
     'ids = np.broadcast_to(np.zeros(1, np.int64), (10**10,))\n'
     'e.backward(ids, np.broadcast_to(np.zeros((1, 2), np.float32), (10**10, 2)))'),
    ("backward_step over a broadcast gradient of 10^10 rows", "MemoryError", "input_ids",
     'e = sg.SplitTokenEmbeddings({"orig": 4}, ["orig"], 2)\n'
     'ids = np.broadcast_to(np.zeros(1, np.int64), (10**10,))\n'
     'e.backward_step(ids, np.broadcast_to(np.zeros((1, 2), np.float32), (10**10, 2)), sg.LazyAdam())'),
    ("backward_step with a gradient of 10^10 rows for 3 ids", "ValueError", "grad_output",
     'e = sg.SplitTokenEmbeddings({"orig": 4}, ["orig"], 2)\n'
     'e.backward_step(np.zeros(3, np.int64), np.broadcast_to(np.zeros((1, 2), np.float32), (10**10, 2)),'
     ' sg.LazyAdam())'),
    ("head forward with 10^10 labels", "MemoryError", "",
     'h = sg.SplitLanguageModellingHead({"orig": 4}, ["orig"], 2)\n'
     'h.forward(np.broadcast_to(np.zeros((1, 2), np.float32), (10**10, 2)),'
     ' np.broadcast_to(np.zeros(1, np.int64), (10**10,)))'),
    ("vocabulary forward with 10^10 tokens", "MemoryError", "",
     'v = sg.SplitVocabulary(np.array([0]), np.array([1]), 4, 2, 2)\n'
     'z = np.broadcast_to(np.zeros(1, np.int64), (10**10,))\n'
     'v.forward(z, z, np.broadcast_to(np.zeros((1, 2), np.float32), (10**10, 2)))'),
    ("Adam's state beyond the memory limit", "MemoryError", "",
     'import os\n'
     'e = sg.SplitTokenEmbeddings({"orig": 2**20}, ["orig"], 64)\n'
     'g = e.backward(np.arange(2**20), np.ones((2**20, 64), np.float32))\n'
     'os.environ["SPLITGRAD_MEMORY_LIMIT"] = "400M"  # the table fits, its two moments (512 MiB) do not\n'
     'try:\n'
     '    sg.Adam(lr=0.1).step(e, g)\n'
     'finally:\n'
     '    del os.environ["SPLITGRAD_MEMORY_LIMIT"]'),
    # Copies handed to or taken from Python are checked before they are made: an allocation that
    # fails would abort the process.
    ("a state dict's copy beyond the address space left", "MemoryError", "state dict",
     'import mmap\n'
     'e = sg.SplitTokenEmbeddings({"a": 500_000}, ["a"], 256)\n'
     'e.set_dtype("bfloat16")\n'
     'vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024\n'
     'ballast = mmap.mmap(-1, (8 << 30) - vm - (100 << 20))  # ~100 MiB left, none of it touched\n'
     'e.state_dict()'),
    # Right after a reading of the limits: the process's own mapping of
    # gigabytes is not in a reading made before it.
    ("a change of dtype beyond the address space left", "MemoryError", "the parameters kept as bf16",
     'import mmap\n'
     'e = sg.SplitTokenEmbeddings({"a": 500_000}, ["a"], 256)\n'
     'vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024\n'
     'ballast = mmap.mmap(-1, (8 << 30) - vm - (100 << 20))  # ~100 MiB left; the bf16 table is 244 MiB\n'
     'e.set_dtype("bfloat16")'),
    ("a checkpoint saved with less address space left than the file's size", None, "",
     'import mmap, os, tempfile\n'
     'e = sg.SplitTokenEmbeddings({"a": 500_000}, ["a"], 256)\n'
     'e.set_dtype("bfloat16")\n'
     'vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024\n'
     'ballast = mmap.mmap(-1, (8 << 30) - vm - (100 << 20))  # ~100 MiB left; the file is 244 MiB\n'
     'with tempfile.TemporaryDirectory() as d:\n'
     '    path = os.path.join(d, "ck.safetensors")\n'
     '    sg.save_checkpoint(path, [e])\n'
     '    assert os.path.getsize(path) > 244 << 20, os.path.getsize(path)'),
    ("copies of state beyond the memory limit", "MemoryError", "",
     'import os\n'
     'e = sg.SplitTokenEmbeddings({"orig": 2**20}, ["orig"], 64)\n'
     'g = e.backward(np.arange(2**20), np.ones((2**20, 64), np.float32))\n'
     'o = sg.Adam(lr=0.1)\n'
     'o.step(e, g)\n'
     'sd, osd = e.state_dict(), o.state_dict()\n'
     'os.environ["SPLITGRAD_MEMORY_LIMIT"] = "100M"  # each of these copies is 256 MiB or more\n'
     'raised = []\n'
     'for what, call in [("state dict", e.state_dict), ("optimiser", o.state_dict),\n'
     '                   ("dense gradient", lambda: g.dense("token_embedding.orig.weight")),\n'
     '                   ("state entry", lambda: e.load_state_dict(sd)),\n'
     '                   ("state entry", lambda: o.load_state_dict(osd, [e]))]:\n'
     '    try:\n'
     '        call()\n'
     '    except MemoryError as err:\n'
     '        assert what in str(err), (what, str(err))\n'
     '        raised.append(what)\n'
     'del os.environ["SPLITGRAD_MEMORY_LIMIT"]\n'
     'assert len(raised) == 5, raised\n'
     'raise MemoryError("each copy refused")'),
    ("a half-precision output counted at its own size", "MemoryError", "the output of forward (shape [300000, 256], bfloat16)",
     'import os\n'
     'e = sg.SplitTokenEmbeddings({"orig": 4}, ["orig"], 256)\n'
     'e.set_dtype("bfloat16")\n'
     'os.environ["SPLITGRAD_MEMORY_LIMIT"] = "200M"\n'
     'try:\n'
     '    out = e.forward(np.zeros(150_000, np.int64), act="bfloat16")  # 77 MB (154 MB in f32)\n'
     '    assert out.dtype == np.uint16 and out.shape == (150_000, 256), (out.dtype, out.shape)\n'
     '    del out\n'
     '    e.forward(np.zeros(300_000, np.int64), act="bfloat16")  # 154 MB\n'
     'finally:\n'
     '    del os.environ["SPLITGRAD_MEMORY_LIMIT"]'),
    ("threads beyond any machine", "ValueError", "more than 1024", "sg.set_num_threads(2**40)"),
    ("a step count that no step follows", "ValueError", "no step count follows",
     'e = sg.SplitTokenEmbeddings({"orig": 4}, ["orig"], 2)\n'
     'g = e.backward(np.arange(4), np.ones((4, 2), np.float32))\n'
     'o = sg.Adam(lr=0.1)\n'
     'o.step(e, g)\n'
     's = o.state_dict()\n'
     'k = [n for n in s if n.endswith(".step")][0]\n'
     's[k] = np.array(2**64 - 1, dtype=np.uint64)\n'
     'o.load_state_dict(s, [e])\n'
     'o.step(e, g)'),
    ("negative split size", "ValueError", "", 'sg.SplitTokenEmbeddings({"orig": -1}, ["orig"], 4)'),
    ("negative hidden size", "ValueError", "", 'sg.SplitTokenEmbeddings({"orig": 2}, ["orig"], -4)'),
    ("ids of a float dtype", "ValueError", "dtype",
     'sg.SplitTokenEmbeddings({"orig": 2}, ["orig"], 4).forward(np.zeros(3))'),
    ("id out of range", "ValueError", "out of range",
     'sg.SplitTokenEmbeddings({"orig": 2}, ["orig"], 4).forward(np.array([2]))'),
    ("negative id", "ValueError", "out of range",
     'sg.SplitTokenEmbeddings({"orig": 2}, ["orig"], 4).forward(np.array([-1]))'),
    ("zero-size state tensors load", None, "",
     'e = sg.SplitTokenEmbeddings({"orig": 2, "none": 0}, ["orig", "none"], 4)\n'
     'e.load_state_dict({"token_embedding.orig.weight": np.ones((2, 4), np.float32),'
     ' "token_embedding.none.weight": np.zeros((0, 4), np.float32)})'),
    ("a zero-size gradient with odd strides", None, "",
     'e = sg.SplitTokenEmbeddings({"orig": 2}, ["orig"], 4)\n'
     'e.backward(np.zeros((0, 3), np.int64), np.zeros((0, 6, 4), np.float32)[:, ::2])'),
    ("a checkpoint that is not a file", "OSError", "", 'sg.load_checkpoint("/", [], None)'),
    ("a thread count of zero", "ValueError", "", "sg.set_num_threads(0)"),
]

TORCH_CASES = [
    ("drop-in table of 10^12 rows", "MemoryError", "token_embedding.orig.weight",
     'st.SplitTokenEmbeddings({"orig": 10**12}, ["orig"], 1024)'),
    ("drop-in head over 10^11 tokens", "MemoryError", "lm_head.orig.weight",
     'st.SplitLanguageModellingHead({"orig": 10**11}, ["orig"], 8)'),
    ("drop-in forward over an expanded view of 10^10 ids", "MemoryError", "input_ids",
     'e = st.SplitTokenEmbeddings({"orig": 4}, ["orig"], 2)\n'
     'e(torch.zeros(1, dtype=torch.long).expand(10**10))'),
    ("drop-in ids on a float tensor", "ValueError", "dtype",
     'st.SplitTokenEmbeddings({"orig": 4}, ["orig"], 2)(torch.zeros(3))'),
    ("drop-in of an unsupported dtype", "TypeError", "float32, float64, bfloat16 or float16",
     'st.SplitTokenEmbeddings({"orig": 4}, ["orig"], 2, dtype=torch.int32)'),
    ("bf16 hidden states into a float32 head (autocast's output)", "ValueError",
     "has dtype torch.bfloat16, expected torch.float32 (the layer's dtype; convert the layer, .to(torch.bfloat16)",
     'h = st.SplitLanguageModellingHead({"orig": 4}, ["orig"], 2)\n'
     'h(torch.zeros(3, 2, dtype=torch.bfloat16), torch.tensor([0, 1, 2]))'),
    ("a conversion to a complex dtype", "TypeError", "not torch.complex64",
     'import warnings\n'
     'warnings.simplefilter("ignore")\n'
     'h = st.SplitLanguageModellingHead({"orig": 4}, ["orig"], 2)\n'
     'try:\n'
     '    h.to(torch.complex64)\n'
     'except TypeError as e:\n'
     '    assert "dtype=torch.complex64" not in str(e), str(e)  # no layer is built in complex\n'
     '    raise'),
    ("a fused state into a layer without fused Adam", "ValueError", "has no fused Adam to load a state into",
     'st.SplitTokenEmbeddings({"orig": 4}, ["orig"], 2).load_fused_optimizer_state({})'),
]

CHILD = r"""
import json, sys, traceback
import numpy as np
import splitgrad as sg
if sys.argv[1] == "torch":
    import torch
    import splitgrad.torch as st
cases = json.loads(sys.stdin.read())
for name, code in cases:
    print(json.dumps({"start": name}), flush=True)
    try:
        exec(code, dict(globals()))
        out = {"name": name, "type": None, "message": ""}
    except BaseException as e:
        out = {"name": name, "type": type(e).__name__, "message": str(e),
               "bases": [c.__name__ for c in type(e).__mro__]}
    print(json.dumps(out), flush=True)
"""

# Every call here must stay far below this; a check that allocates the
# size it is about to refuse fails under it.
LIMIT = 8 << 30


def _limit_memory():
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def run_cases(kind, cases, limit_address_space=True):
    """Runs the cases in child interpreters; after a crash, a new child runs the rest.

    Returns {name: result}, where a crash is {"crashed": "exit code and the end of stderr"}.
    """
    env = dict(os.environ, RUST_BACKTRACE="0")
    results, todo = {}, [(n, textwrap.dedent(c)) for n, _, _, c in cases]
    while todo:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, kind],
            input=json.dumps(todo),
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            preexec_fn=_limit_memory if limit_address_space else None,
        )
        running = None
        for line in proc.stdout.splitlines():
            rec = json.loads(line)
            if "start" in rec:
                running = rec["start"]
            else:
                results[rec["name"]] = rec
                running = None
        if running is not None:
            results[running] = {"crashed": f"exit {proc.returncode}: {proc.stderr[-400:]}"}
        done = set(results)
        left = [c for c in todo if c[0] not in done]
        if len(left) == len(todo):  # the child died before its first case
            raise AssertionError(f"the child interpreter does not start: {proc.stderr[-2000:]}")
        todo = left
    return results


def check(cases, results):
    failures = []
    for name, want_type, fragment, _ in cases:
        got = results[name]
        if "crashed" in got:
            failures.append(f"{name}: the interpreter died ({got['crashed']})")
        elif want_type is None:
            if got["type"] is not None:
                failures.append(f"{name}: expected no error, got {got['type']}: {got['message']}")
        elif got["type"] is None:
            failures.append(f"{name}: expected {want_type}, nothing was raised")
        elif want_type not in got["bases"]:
            failures.append(f"{name}: expected {want_type}, got {got['type']}: {got['message']}")
        elif fragment not in got["message"]:
            failures.append(f"{name}: message {got['message']!r} lacks {fragment!r}")
    assert not failures, "\n".join(failures)


def test_hostile_numpy_calls_raise_with_a_message():
    check(NUMPY_CASES, run_cases("numpy", NUMPY_CASES))


def test_hostile_torch_calls_raise_with_a_message():
    pytest.importorskip("torch", reason="torch is not installed")
    # torch maps more address space than a limit this low leaves room for
    check(TORCH_CASES, run_cases("torch", TORCH_CASES, limit_address_space=False))


def test_the_table_is_checked():
    # a wrong fragment is reported, so the table cannot pass vacuously
    bad = [("id out of range", "ValueError", "no such words",
            'sg.SplitTokenEmbeddings({"orig": 2}, ["orig"], 4).forward(np.array([2]))')]
    with pytest.raises(AssertionError, match="lacks"):
        check(bad, run_cases("numpy", bad))
