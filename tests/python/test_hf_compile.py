"""A Hugging Face LlamaForCausalLM converted by snip.convert: every
projection becomes a snip.nn.Linear (lm_head kept), the logits are the same
eager and under torch.compile, and a training step runs through it."""
import pytest
import torch
import transformers

import snip


def tiny_llama(seed=0):
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval()


def converted(recipe="mxfp4"):
    m = tiny_llama()
    snip.convert(m, recipe=recipe, module_filter_fn=lambda mod, fqn: fqn != "lm_head")
    return m


def test_convert_swaps_the_projections_and_keeps_the_keys():
    ref = tiny_llama()
    m = converted()
    table = snip.precision_table(m)
    assert len(table) == 2 * 7 and "lm_head" not in table
    assert "model.layers.1.mlp.down_proj" in table
    assert list(m.state_dict()) == list(ref.state_dict())
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = m(ids).logits, ref(ids).logits
    assert not torch.equal(a, b)  # quantized: not the BF16 model's logits
    torch.testing.assert_close(a, b, rtol=0.5, atol=0.5)  # but the same model


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_same_logits_eager_and_compiled(backend):
    m = converted()
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        eager = m(ids).logits
        compiled = torch.compile(m, backend=backend, fullgraph=False)(ids).logits
    if backend == "aot_eager":
        assert torch.equal(eager, compiled)  # the same kernels: the same bits
    else:
        # Inductor fuses the ops around the quantized GEMMs (norms, softmax)
        # in its own order; the quantized GEMMs are snip's own kernels.
        torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)


def test_a_training_step_runs_and_moves_the_weights():
    m = converted("nvfp4").train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(3))
    w0 = m.model.layers[0].mlp.down_proj.weight.detach().clone()
    loss = m(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters() if p.requires_grad)
    opt.step()
    snip.set_step(m, 1)
    assert not torch.equal(w0, m.model.layers[0].mlp.down_proj.weight)
