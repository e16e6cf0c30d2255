"""Request bodies: exact token-id prompts, text prompts and the chat API."""

import json

import pytest

from filledfirst.contracts.records import ScheduledRequest
from filledfirst.loadgen.prompts import completion_body, endpoint

REQ = ScheduledRequest(request_id=7, t_offset_s=0.0, prompt_tokens=40, output_tokens=9, role="probe")


def body(**kw) -> dict:
    return json.loads(completion_body(REQ, model="m", low=10, high=20, seed=3, **kw))


def test_token_ids_exact_and_deterministic():
    b = body()
    assert len(b["prompt"]) == 40 and all(10 <= i < 20 for i in b["prompt"])
    assert b == body() and b["prompt"] != json.loads(completion_body(REQ, model="m", low=10, high=20, seed=4))["prompt"]
    assert (b["max_tokens"], b["min_tokens"], b["ignore_eos"]) == (9, 9, True)


def test_text_prompt_one_word_per_token_asked():
    b = body(prompt="text")
    assert isinstance(b["prompt"], str) and len(b["prompt"].split()) == 40


def test_chat_body_carries_the_text_as_a_user_message():
    b = body(api="chat", prompt="text")
    assert "prompt" not in b and b["messages"][0]["role"] == "user"
    assert len(b["messages"][0]["content"].split()) == 40
    assert endpoint("chat") == "/v1/chat/completions" and endpoint("completions") == "/v1/completions"


def test_chat_refuses_token_ids():
    with pytest.raises(ValueError, match="text prompts only"):
        body(api="chat")
