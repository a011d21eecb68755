"""The semantic cache through a real `hybridkv serve` process and the official
openai client: hits stream back the stored answer with the header, tenants,
negations and opt-outs miss, two instances share a Redis, Redis down is a miss."""

import uuid

from server_process import wait_until

from hybridkv.semantic.front import HEADER

GREEDY = {"temperature": 0.0, "max_tokens": 6}


def ask(server, text, api_key="key-a", stream=False, **extra):
    """(header, answer text) of one chat request."""
    client = server.client().with_options(api_key=api_key)
    raw = client.chat.completions.with_raw_response.create(
        model="tiny-chat", messages=[{"role": "user", "content": text}], stream=stream,
        extra_body=extra, **GREEDY)
    header = raw.headers.get(HEADER)
    reply = raw.parse()
    if stream:
        return header, "".join(c.choices[0].delta.content or "" for c in reply if c.choices)
    return header, reply.choices[0].message.content


def unique(text):
    """`text` about a topic no other test asked about (a fresh word)."""
    return text.replace("TOPIC", "Zorblax" + uuid.uuid4().hex[:6].upper())


def test_paraphrase_hits_and_streams_the_stored_answer(cached_pair):
    server, _ = cached_pair
    question = unique("What is the capital city of TOPIC?")
    header, answer = ask(server, question)
    assert header == "miss"
    header, streamed = ask(server, question.replace("What is", "What's"), stream=True)
    assert header.startswith("hit; similarity=")
    assert 0.9 <= float(header.split("=")[1]) <= 1.0
    assert streamed == answer


def test_hit_answers_what_the_model_answered(cached_pair):
    server, _ = cached_pair
    question = unique("How do I reverse a list in TOPIC?")
    header, model_answer = ask(server, question)
    assert header == "miss"
    header, cached = ask(server, question.replace("How do I reverse a list in",
                                                  "How can I reverse a list in"))
    assert header.startswith("hit")
    assert cached == model_answer


def test_another_tenant_misses(cached_pair):
    server, _ = cached_pair
    question = unique("Who founded TOPIC?")
    ask(server, question, api_key="tenant-one")
    assert ask(server, question, api_key="tenant-one")[0].startswith("hit")
    assert ask(server, question, api_key="tenant-two")[0] == "miss"
    assert ask(server, question, api_key="tenant-one", cache_salt="other")[0] == "miss"


def test_negated_question_misses(cached_pair):
    server, _ = cached_pair
    question = unique("Is TOPIC bad for your health?")
    ask(server, question)
    assert ask(server, question.replace(" bad", " not bad"))[0] == "miss"


def test_opt_out_and_unreusable_requests_are_not_looked_up(cached_pair):
    server, _ = cached_pair
    question = unique("Where is TOPIC?")
    ask(server, question)
    assert ask(server, question)[0].startswith("hit")
    assert ask(server, question, semantic_cache=False)[0] is None
    client = server.client().with_options(api_key="key-a")
    raw = client.chat.completions.with_raw_response.create(
        model="tiny-chat", messages=[{"role": "user", "content": question}], max_tokens=4,
        temperature=1.0)
    assert raw.headers.get(HEADER) is None


def test_completions_hit_with_usage(cached_pair):
    server, _ = cached_pair
    client = server.client().with_options(api_key="key-a")
    prompt = unique("The history of TOPIC")
    stored = server.metrics()["hybridkv:semantic_cache_entries"]
    first = client.completions.create(model="tiny-chat", prompt=prompt, **GREEDY)
    # the answer is stored after it is sent: wait for it before asking again
    wait_until(lambda: server.metrics()["hybridkv:semantic_cache_entries"] > stored,
               timeout=10, what="the first answer to be stored")
    raw = client.completions.with_raw_response.create(
        model="tiny-chat", prompt=prompt + ".", stream=True,
        stream_options={"include_usage": True}, **GREEDY)
    assert raw.headers.get(HEADER).startswith("hit")
    chunks = list(raw.parse())
    assert "".join(c.choices[0].text for c in chunks if c.choices) == first.choices[0].text
    usage = chunks[-1].usage
    assert usage.completion_tokens == first.usage.completion_tokens
    assert usage.prompt_tokens > 0


def test_two_instances_share_entries(cached_pair):
    first, second = cached_pair
    question = unique("When was TOPIC built?")
    _, answer = ask(first, question)
    wait_until(lambda: ask(second, question)[0].startswith("hit"), timeout=10,
               what="the second instance to see the first one's entry")
    header, shared = ask(second, question.replace("When was", "When was the"))
    assert shared == answer or header == "miss"
    metrics = second.metrics()
    assert metrics["hybridkv:semantic_cache_hits_total{kind=exact}"] >= 1
    assert metrics["hybridkv:semantic_cache_entries"] >= 1


def test_redis_down_costs_a_miss_not_a_request(cached_pair, semantic_redis):
    server, _ = cached_pair
    question = unique("What is TOPIC?")
    ask(server, question)
    model_answer = ask(server, question, semantic_cache=False)[1]  # the model, not the cache
    semantic_redis.kill()
    try:
        for stream in (False, True):
            header, answer = ask(server, question, stream=stream)
            assert header == "miss"
            assert answer == model_answer  # answered by the model (its text may be empty)
        assert server.metrics()["hybridkv:semantic_cache_store_errors_total"] >= 1
    finally:
        semantic_redis.start()
    again = unique("Why TOPIC?")
    wait_until(lambda: ask(server, again)[0].startswith("hit"), timeout=10,
               what="the cache to work again once Redis is back")
