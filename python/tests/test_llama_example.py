"""python/examples/llama.py, kcode18M through skim's operators: its logits are the same model's with a
plain PyTorch attention, its tokenizer is llama2.c's, and its greedy needle answers through skim's
prefill and decode are plain attention's. Skipped without the models directory."""

import random
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import llama  # noqa: E402

pytestmark = pytest.mark.skipif(not (llama.MODELS / "kcode18M.bin").is_file(),
                                reason=f"no kcode18M.bin in {llama.MODELS} (set SKIM_MODELS_DIR)")


@pytest.fixture(scope="module")
def model():
    m = llama.Model(llama.MODELS / "kcode18M.bin", "cpu")
    return m, llama.Tokenizer(llama.MODELS / "tok_kbpe.bin", m.vocab)


def llama2c_merge(tok, ids):
    """llama2.c's merge loop as written there: rescan every pair, merge the best (leftmost on ties)."""
    ids = list(ids)
    while True:
        best, at = -1e10, -1
        for i in range(len(ids) - 1):
            m = tok.ids.get(tok.pieces[ids[i]] + tok.pieces[ids[i + 1]])
            if m is not None and tok.scores[m] > best:
                best, at = tok.scores[m], i
        if at < 0:
            return ids
        ids[at:at + 2] = [tok.ids[tok.pieces[ids[at]] + tok.pieces[ids[at + 1]]]]


def test_tokenizer_is_llama2c(model):
    _, tok = model
    rng = random.Random(5)
    files = llama.held_out_files()
    for _ in range(6):
        f = rng.choice(files)
        start = rng.randrange(max(1, len(f) - 400))
        text = f[start:start + 400] + " é→"  # code points outside the pieces: byte tokens
        unmerged = [1, tok.ids[b" "]] + [i for ch in text for i in
                                          ([tok.ids[ch.encode()]] if ch.encode() in tok.ids else
                                           [b + 3 for b in ch.encode()])]
        assert tok.encode(text) == llama2c_merge(tok, unmerged)
        assert tok.decode(tok.encode(text)[1:]).lstrip(" ") == text.lstrip(" ")


def test_logits_through_skim_are_the_model(model):
    m, tok = model
    ids = tok.encode(random.Random(6).choice(llama.held_out_files())[:4000])[:300]
    with torch.no_grad():
        ours = llama.forward(m, ids, llama.new_cache(m), llama.Attend())
        plain = llama.forward(m, ids, llama.new_cache(m), llama.dense_attention)
    assert (ours - plain).abs().max().item() < 1e-3
    assert torch.equal(ours.argmax(-1), plain.argmax(-1))
    loss = torch.nn.functional.cross_entropy(ours[:-1], torch.tensor(ids[1:])).item()
    assert loss < 3.0, "a model that reads code (uniform over 4096 pieces: 8.3 nats)"


def test_needle_answers_through_skim(model):
    m, tok = model
    prompt, value = llama.needle_prompt(tok, llama.held_out_files(), 1200, random.Random(7))
    assert tok.decode(prompt).count(value) == 1 and len(prompt) == 1200
    with torch.no_grad():
        got = llama.answers(m, tok, prompt, {"skim": llama.Attend(), "plain": llama.dense_attention,
                                             "routed": llama.Attend(select=llama.max_bound_selector(0.25)),
                                             "window": llama.Attend(select=llama.window_selector(0.25))})
    assert got["skim"] == got["plain"]
    assert all(len(a) > 0 for a in got.values())
