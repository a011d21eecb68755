"""RMSNorms run as one torch.rms_norm call: same outputs as the Hugging Face modules."""

import pytest
import torch
from torch import nn
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from hybridkv.models.fused_norm import FusedNorms, norm_eps


@pytest.mark.parametrize("norm_class", [Gemma3RMSNorm, LlamaRMSNorm])
@pytest.mark.parametrize("shape", [(1, 64), (8, 64), (700, 64), (8, 4, 64)])
def test_fused_norm_matches_the_module(norm_class, shape):
    torch.manual_seed(0)
    module = norm_class(64, eps=1e-5)
    with torch.no_grad():
        module.weight.normal_()
    norms = FusedNorms()
    assert norms.add(module) and not norms.add(module) and len(norms) == 1
    x = torch.randn(*shape) * 3
    torch.testing.assert_close(norms.apply(module, x), module(x), rtol=1e-6, atol=1e-6)


def test_what_is_not_fused():
    norms = FusedNorms()
    gemma_half = Gemma3RMSNorm(64).to(torch.bfloat16)
    for module in (nn.LayerNorm(64), gemma_half, nn.Linear(4, 4)):
        assert norm_eps(module) is None and not norms.add(module)
    gemma = Gemma3RMSNorm(64)
    norms.add(gemma)
    x = torch.randn(8, 64, dtype=torch.float64)  # not float32: the module runs itself
    assert torch.equal(norms.apply(gemma, x), gemma(x))
    other = Gemma3RMSNorm(64)  # never added
    y = torch.randn(8, 64)
    assert torch.equal(norms.apply(other, y), other(y))


def test_the_weight_is_taken_once():
    module = Gemma3RMSNorm(64)
    norms = FusedNorms()
    norms.add(module)
    x = torch.randn(8, 64)
    before = norms.apply(module, x)
    torch.testing.assert_close(before, module(x), rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        module.weight.fill_(1.0)
    assert torch.equal(norms.apply(module, x), before)
    assert not torch.equal(module(x), before)


def test_add_all_takes_every_supported_norm():
    model = nn.Sequential(Gemma3RMSNorm(8), nn.Linear(8, 8), LlamaRMSNorm(8), nn.LayerNorm(8))
    assert FusedNorms().add_all(model) == 2
