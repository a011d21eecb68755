"""Decode steps through prepacked weights stay token-exact with Hugging Face's greedy output.

The presets' weights are below the packing threshold, so this widens gemma3-tiny until
its projections and MLPs are packed, then decodes several requests together (decode
steps of 2 to 4 rows: the packed path) and compares with `model.generate` on each
prompt alone.
"""

import torch
from transformers import AutoModelForCausalLM

from hybridkv import LLM, SamplingParams
from hybridkv.models.presets import get_preset

MAX_TOKENS = 8


def wide_gemma3(seed=0):
    config = get_preset("gemma3-tiny").build_config(
        hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=1,
        head_dim=64)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


def test_packed_decode_equals_hugging_face():
    model = wide_gemma3()
    g = torch.Generator().manual_seed(1)
    base = torch.randint(0, 512, (48,), generator=g).tolist()
    prompts = [base, base[:40] + [7, 8], base[:17], torch.randint(0, 512, (30,), generator=g)
               .tolist()]
    expected = []
    for prompt in prompts:
        out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS,
                             min_new_tokens=MAX_TOKENS, do_sample=False)
        expected.append(out[0, len(prompt):].tolist())
    llm = LLM(model, block_size=8, num_blocks=64)
    assert len(llm.runner.linears) > 0  # the packed path is what runs the decode steps
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    assert [o.output_token_ids for o in outs] == expected
