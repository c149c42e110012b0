"""A short agent conversation shared by the summarizer, prompt and finish tests: a fact
stated by the user, a tool call and its result, signed thinking, an Anthropic-shaped
tool result inside a user turn."""

from __future__ import annotations

from typing import Any

MESSAGES: list[dict[str, Any]] = [
    {
        "role": "user",
        "content": "My name is Ada. Please move the ledger to PostgreSQL; the port is 8443.",
    },
    {
        "role": "assistant",
        "content": "Let's use asyncpg. I'll read the config first.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "service/config.yaml"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "db: sqlite\nport: 8443"},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "secret chain of thought", "signature": "sig=="},
            {"type": "text", "text": "Config read. We decided to keep port 8443."},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_9", "content": "ImportError: asyncpg"},
            {"type": "text", "text": "It failed with ImportError, fix it please."},
        ],
    },
]
