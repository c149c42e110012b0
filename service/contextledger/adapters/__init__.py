"""Framework adapters: contextledger behind the session stores agent frameworks expect.

One module per framework, each an optional extra; importing ``contextledger`` never
imports a framework, and a missing extra raises ``MissingExtra`` with the pip command.

- ``contextledger.adapters.openai_agents``: ``LedgerSession``, an OpenAI Agents SDK ``Session``
  (``[openai-agents]``).
- ``contextledger.adapters.adk``: ``LedgerSessionService``, a Google ADK
  ``BaseSessionService`` (``[adk]``).
- ``contextledger.adapters.langchain``: ``LedgerChatMessageHistory``, a LangChain
  ``BaseChatMessageHistory``, and ``LedgerAgentMemory``, LangGraph pre/post-model hooks
  that keep an agent's thread in the ledger and fit the prompt (``[langchain]``).
- ``contextledger.adapters.pydantic_ai``: pydantic-ai message history and a history
  processor that fits the budget (``[pydantic-ai]``).
"""
