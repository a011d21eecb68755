"""`hybridkv serve ...` whose engine loop raises (fault injection for the tests).

    python tests/serving/faulty_serve.py serve gemma3-tiny --port P

`LLM.step` raises RuntimeError("injected engine fault") from the first step
after a request with `max_tokens` 13 arrives; every other step is the real one.
"""

import sys

from hybridkv.engine.llm import LLM
from hybridkv.tools.cli import main

TRIGGER_MAX_TOKENS = 13
_add_request = LLM.add_request
_step = LLM.step
_armed = []


def add_request(self, prompt, params=None, **kwargs):
    if params is not None and params.max_tokens == TRIGGER_MAX_TOKENS:
        _armed.append(True)
    return _add_request(self, prompt, params, **kwargs)


def step(self):
    if _armed:
        raise RuntimeError("injected engine fault")
    return _step(self)


LLM.add_request = add_request
LLM.step = step

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
