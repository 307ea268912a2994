"""The Python examples of README.md and python/README.md run as written (on the CPU where no GPU is:
"cuda" becomes "cpu") and give attention over exactly the blocks they choose, checked in float64."""

import math
import re
from pathlib import Path

import pytest
import torch

import skim_torch  # noqa: F401  (the examples import it too)

ROOT = Path(__file__).resolve().parents[2]


def example(path):
    """The python block of `path` that calls sparse_attention_paged."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / path).read_text(), re.S)
    return next(b for b in blocks if "sparse_attention_paged" in b)


@pytest.mark.parametrize("path", ["README.md", "python/README.md"])
def test_readme_example(path):
    code = example(path)
    if not (torch.cuda.is_available() and skim_torch.has_cuda_kernels()):
        code = code.replace('device="cuda"', 'device="cpu"')
    scope = {}
    torch.manual_seed(0)
    exec(compile(code, path, "exec"), scope)  # noqa: S102 - the documented example itself
    q, k, v, ids, o, lse = (scope[x] for x in ("q", "k", "v", "ids", "o", "lse"))
    bk, hq, hkv = scope["bk"], scope["hq"], scope["hkv"]
    group, scale = hq // hkv, 1.0 / math.sqrt(q.shape[-1])
    for b in range(k.shape[0]):
        for h in range(hq):
            blocks = ids[b * hkv + h // group].long().cpu()
            keys = (blocks[:, None] * bk + torch.arange(bk)).flatten()
            kk, vv = k[b, h // group, keys].double().cpu(), v[b, h // group, keys].double().cpu()
            s = scale * kk @ q[b, h].double().cpu()
            ref = torch.softmax(s, 0) @ vv
            torch.testing.assert_close(o[b, h].double().cpu(), ref, atol=2e-2, rtol=2e-2)
            torch.testing.assert_close(lse[b, h].double().cpu(), torch.logsumexp(s, 0), atol=1e-3, rtol=1e-4)
