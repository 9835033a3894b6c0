"""Golden cases in bf16 and f16 (docs/spec.md §4) against PyTorch.

A half-precision case holds the layer's parameters and activations in the
half type; splitgrad computes it in f32 on the widened values and writes the
layer's output rounded once to the half type, the gradients and penalties in
f32. Two references check that:

- torch in float64 on the same widened values: the output, rounded once, is
  the half value of the float64 result (within one unit in the last place,
  where the f32 and float64 results straddle a rounding boundary), bit for
  bit for the embeddings' gather; the gradients agree to the float32
  tolerance of docs/golden.md;
- torch computing in the half type itself (d9d's embeddings after
  ``.to(torch.bfloat16)``, the plain layers of test_testing.py in bf16 /
  f16): the tolerance docs/golden.md recommends for
  such an implementation holds."""

import os
import tempfile

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: no PyTorch reference")
pytest.importorskip("hypothesis", reason="hypothesis is not installed: splitgrad.testing needs it")

from splitgrad import golden, testing  # noqa: E402
from test_testing import PlainEmbeddings, PlainHead, PlainVocabulary  # noqa: E402

HALF = {"bf16": torch.bfloat16, "f16": torch.float16}
CASES = int(os.environ.get("SPLITGRAD_HALF_CASES", "150"))
# The recommended tolerances of docs/golden.md for half-precision cases:
# the output against a half-precision implementation, and the gradients
# against one that computes in f32 inside (rtol · (1 + max|b|), per array).
OUTPUT_ULPS = 1
GRAD_RTOL_F32 = 1e-5
HALF_RTOL = {"bf16": 5e-2, "f16": 2e-2}


def d9d_embeddings():
    mod = pytest.importorskip("d9d.module.block.embedding", reason="d9d is not installed: no check of it")
    return mod.SplitTokenEmbeddings


def is_real(a, dtype):
    return a.dtype == (np.uint16 if dtype == "bf16" else np.float16)


def to_torch(a, dtype):
    """A case's half array as a torch tensor of the half type (bits kept)."""
    if dtype == "bf16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def widened(a, dtype):
    return to_torch(a, dtype).double().numpy()


def half_result(x, dtype):
    """float64 results rounded once to the half type, widened back."""
    return torch.from_numpy(np.asarray(x, np.float64)).to(HALF[dtype]).double().numpy()


def ulp(x, dtype):
    """One unit in the last place of the half type at |x| (its smallest subnormal near 0)."""
    info = torch.finfo(HALF[dtype])
    mant = {"bf16": 7, "f16": 10}[dtype]
    e = np.floor(np.log2(np.maximum(np.abs(x), info.smallest_normal)))
    return np.exp2(e - mant)


def case_and_inputs(layer, seed, dtype):
    case = golden.generate(layer, seed, dtype=dtype)
    inputs = {k: v for k, v in case.items() if not testing._is_result(layer, k)}
    return case, inputs


FACTORIES = {
    "split-embeddings": lambda: PlainEmbeddings,
    "lm-head": lambda: PlainHead,
    "split-vocabulary": lambda: PlainVocabulary,
}


def worst_rel(a, b):
    return float(np.abs(a - b).max(initial=0) / (1 + np.abs(b).max(initial=0)))


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("layer", golden.LAYERS)
def test_half_cases_agree_with_torch_in_float64_on_the_widened_values(layer, dtype):
    factory = FACTORIES[layer]()
    output = "loss" if layer == "lm-head" else "out"
    worst_grad, off_by_one, total = 0.0, 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(CASES):
            case, inputs = case_and_inputs(layer, seed, dtype)
            wide = {k: widened(v, dtype) if is_real(v, dtype) else v for k, v in inputs.items()}
            ref = testing._run(layer, factory, testing.Case(layer, wide), tmp)
            assert ref.error is None, ref.describe_error()
            assert is_real(case[output], dtype), f"{output} is {case[output].dtype}"
            ours = widened(case[output], dtype)
            theirs = half_result(ref.values[output], dtype)
            large = layer == "lm-head" and np.abs(wide["hidden"]).max(initial=0) > 100
            if layer == "split-embeddings":
                np.testing.assert_array_equal(ours, theirs)  # a gather: the bits themselves
            elif large:
                # docs/golden.md: with logits in the thousands each f32 logit carries
                # an error of 2.4e-4, and so does a loss near 0
                assert (np.abs(ours - theirs) <= 1e-3 + ulp(theirs, dtype)).all(), seed
            else:
                gap = np.abs(ours - theirs) / ulp(theirs, dtype)
                assert gap.max(initial=0) <= OUTPUT_ULPS, (seed, gap.max())
                off_by_one += int((gap > 0).sum())
                total += gap.size
            for name, b in ref.values.items():
                if name == output or b is None:
                    continue
                a = case[name]
                assert a.dtype == np.float32, (name, a.dtype)
                if large:  # docs/golden.md: f32 logits in the thousands carry their own rounding
                    assert np.isfinite(a).all()
                    continue
                worst_grad = max(worst_grad, worst_rel(a.astype(np.float64), b))
    print(f"\n{layer} {dtype}: outputs one ulp off {off_by_one}/{total}; worst f32 result {worst_grad:.2e}")
    assert worst_grad <= GRAD_RTOL_F32


def run_in_half(layer, inputs, dtype, tmp):
    """The case run by torch in the half type itself: the module's parameters,
    the activations and every operation in bf16 / f16."""
    t = HALF[dtype]
    h = lambda name: to_torch(inputs[name], dtype)  # noqa: E731
    out = {}
    if layer == "split-embeddings":
        sizes = [int(s) for s in inputs["split_sizes"]]
        names = [f"s{k}" for k in range(len(sizes))]
        # d9d's module where it runs (it fails on a split of size 0)
        cls = d9d_embeddings() if all(sizes) else PlainEmbeddings
        m = cls(dict(zip(names, sizes)), names, int(inputs["weight_0"].shape[1])).to(t)
        m.load_state_dict({f"token_embedding.{n}.weight": h(f"weight_{k}") for k, n in enumerate(names)})
        y = m(torch.from_numpy(inputs["input_ids"]))
        y.backward(h("upstream"))
        out["out"] = y
        for k, n in enumerate(names):
            if inputs["split_trainable"][k]:
                out[f"grad_weight_{k}"] = m.token_embedding[n].weight.grad
    elif layer == "lm-head":
        sizes = [int(s) for s in inputs["split_sizes"]]
        names = [f"s{k}" for k in range(len(sizes))]
        m = PlainHead(dict(zip(names, sizes)), names, int(inputs["weight_0"].shape[1])).to(t)
        m.load_state_dict({f"lm_head.{n}.weight": h(f"weight_{k}") for k, n in enumerate(names)})
        hidden = h("hidden").requires_grad_(True)
        loss = m(hidden, testing.LMHeadShared(torch.from_numpy(inputs["labels"])))
        loss.backward(h("upstream"))
        out["loss"], out["grad_hidden"] = loss, hidden.grad
        for k, n in enumerate(names):
            out[f"grad_weight_{k}"] = m.lm_head[n].weight.grad
    else:
        path = f"{tmp}/index.npz"
        np.savez(path, language_index=inputs["language_index"], token_index=inputs["token_index"])
        before = torch.get_default_dtype()
        torch.set_default_dtype(t)  # the plain layer makes its work arrays in the default dtype
        try:
            m = PlainVocabulary(
                path, int(inputs["vocab_size"]), int(inputs["rows"].shape[1]), int(inputs["n_languages"])
            )
            m.load_state_dict({"rows": h("rows"), "gate_logit": h("gate_logit")})
            shared = h("shared").requires_grad_(True)
            y = m(torch.from_numpy(inputs["token_ids"]), torch.from_numpy(inputs["language_ids"]), shared,
                  bool(int(inputs["use_gate"])))
            pen, fus = m.penalty(), m.fusion_penalty()
        finally:
            torch.set_default_dtype(before)
        loss = ((y * h("upstream")).sum() + h("penalty_weight") * pen) + h("fusion_weight") * fus
        loss.backward()
        out.update(out=y, penalty=pen, fusion_penalty=fus, loss=loss, grad_shared=shared.grad,
                   grad_rows=m.rows.grad, grad_gate_logit=m.gate_logit.grad)
    return {k: (None if v is None else v.detach().double().numpy()) for k, v in out.items()}


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("layer", golden.LAYERS)
def test_a_torch_module_computing_in_half_precision_meets_the_recommended_tolerance(layer, dtype):
    worst = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(CASES):
            case, inputs = case_and_inputs(layer, seed, dtype)
            if layer == "lm-head" and np.abs(widened(inputs["hidden"], dtype)).max(initial=0) > 100:
                continue  # logits in the thousands: every half-precision logit is off by units
            theirs = run_in_half(layer, inputs, dtype, tmp)
            for name, a in theirs.items():
                b = case[name]
                b = widened(b, dtype) if is_real(b, dtype) else b.astype(np.float64)
                a = np.zeros_like(b) if a is None else a
                worst[name] = max(worst.get(name, 0.0), worst_rel(a, b))
    print(f"\n{layer} {dtype}: " + ", ".join(f"{k} {v:.1e}" for k, v in sorted(worst.items())))
    assert max(worst.values()) <= HALF_RTOL[dtype], worst


def test_half_case_dtypes_and_errors(tmp_path):
    case = golden.generate("split-vocabulary", 3, dtype="bfloat16")
    assert case["rows"].dtype == np.uint16 and case["out"].dtype == np.uint16
    assert case["grad_rows"].dtype == np.float32 and case["penalty"].dtype == np.float32
    f16 = golden.generate("lm-head", 3, dtype=torch.float16)
    assert f16["hidden"].dtype == np.float16 and f16["loss"].dtype == np.float16
    # a bf16 case evaluates to the results it was generated with
    inputs = {k: v for k, v in case.items() if not testing._is_result("split-vocabulary", k)}
    again = golden.evaluate("split-vocabulary", inputs)
    for k, v in again.items():
        np.testing.assert_array_equal(v, case[k])
    # a float32 array in a bf16 case names both arrays
    bad = dict(inputs, upstream=widened(inputs["upstream"], "bf16").astype(np.float32))
    with pytest.raises(ValueError, match="`shared` is uint16 \\(bf16 bits\\), `upstream` is float32"):
        golden.evaluate("split-vocabulary", bad)
    # a NaN's bits are refused with their position
    nan = inputs["rows"].copy()
    nan[0, 0] = 0x7FC0
    with pytest.raises(ValueError, match=r"array `rows`: non-finite value NaN at position \[0, 0\]"):
        golden.evaluate("split-vocabulary", dict(inputs, rows=nan))
