"""Chat messages to prompt token ids with a tokenizer's chat template.

    render_chat(tokenizer, [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "Hi"}])
    # gemma3-tiny: the ids of
    # '<bos><start_of_turn>user\\nBe brief.\\n\\nHi<end_of_turn>\\n<start_of_turn>model\\n'

A message is a dict with `role` (system, user or assistant) and `content`:
a string, or a list of text parts `{"type": "text", "text": "..."}` (joined
with newlines), as the OpenAI chat API sends them. Other keys are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ROLES = ("system", "user", "assistant")


def check_messages(messages: Any) -> list[dict[str, str]]:
    """Validated messages as `{"role", "content"}` dicts with string content.

    ValueError naming the field and its index, e.g. "messages[1].role: unknown
    role 'wizard'; expected one of system, user, assistant".
    """
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise ValueError(f"messages must be a non-empty list of {{'role', 'content'}} dicts, "
                         f"got {_brief(messages)}")
    return [_check_message(i, message) for i, message in enumerate(messages)]


def _check_message(i: int, message: Any) -> dict[str, str]:
    if not isinstance(message, Mapping):
        raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', "
                         f"got {_brief(message)}")
    role = message.get("role")
    if role is None:
        raise ValueError(f"messages[{i}].role is missing")
    if role not in ROLES:
        raise ValueError(f"messages[{i}].role: unknown role {_brief(role)}; expected one of "
                         f"{', '.join(ROLES)}")
    return {"role": role, "content": _content_text(i, message.get("content"))}


def _content_text(i: int, content: Any) -> str:
    if content is None:
        raise ValueError(f"messages[{i}].content is missing")
    if isinstance(content, str):
        return content
    if isinstance(content, bytes) or not isinstance(content, Sequence):
        raise ValueError(f"messages[{i}].content must be a string or a list of text parts, "
                         f"got {_brief(content)}")
    texts = []
    for j, part in enumerate(content):
        text = part.get("text") if isinstance(part, Mapping) else None
        if not isinstance(part, Mapping) or part.get("type") != "text" or \
                not isinstance(text, str):
            raise ValueError(f"messages[{i}].content[{j}] must be {{'type': 'text', "
                             f"'text': str}}, got {_brief(part)}")
        texts.append(text)
    return "\n".join(texts)


def render_chat_text(tokenizer: Any, messages: Any, *,
                     add_generation_prompt: bool = True) -> str:
    """The prompt text of `messages` under the tokenizer's chat template.

    ValueError when there is no tokenizer or it has no chat template, or a
    message is malformed (see `check_messages`).
    """
    if tokenizer is None:
        raise ValueError("chat needs a tokenizer, and this model has none; pass "
                         "tokenizer= (an object or a directory) or use token-id prompts")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"the tokenizer ({type(tokenizer).__name__}) has no chat template; "
                         f"set tokenizer.chat_template or use plain prompts")
    checked = check_messages(messages)
    try:
        return tokenizer.apply_chat_template(checked, tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
    except Exception as error:  # jinja errors, raise_exception() in a template
        raise ValueError(f"the chat template could not render these messages: "
                         f"{error}") from error


def render_chat(tokenizer: Any, messages: Any, *,
                add_generation_prompt: bool = True) -> list[int]:
    """Prompt token ids of `messages`: the rendered template, encoded without
    adding special tokens (the template writes the ones it wants, e.g. bos)."""
    text = render_chat_text(tokenizer, messages, add_generation_prompt=add_generation_prompt)
    return list(tokenizer.encode(text, add_special_tokens=False))


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def render_conversations(tokenizer: Any, conversations: Any, *,
                         add_generation_prompt: bool = True) -> list[list[int]]:
    """Prompt ids of one conversation (a list of message dicts) or of a list
    of conversations; errors name the conversation too ("conversation 1: ...")
    when a list of them was given."""
    single = isinstance(conversations, Sequence) and bool(conversations) and \
        isinstance(conversations[0], Mapping)
    if single:
        return [render_chat(tokenizer, conversations,
                            add_generation_prompt=add_generation_prompt)]
    if isinstance(conversations, str | bytes) or not isinstance(conversations, Sequence) or \
            not conversations:
        raise ValueError(f"chat takes a conversation (a list of message dicts) or a non-empty "
                         f"list of conversations, got {_brief(conversations)}")
    prompts = []
    for k, conversation in enumerate(conversations):
        try:
            prompts.append(render_chat(tokenizer, conversation,
                                       add_generation_prompt=add_generation_prompt))
        except ValueError as error:
            raise ValueError(f"conversation {k}: {error}") from error
    return prompts
