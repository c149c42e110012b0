"""Framework adapters: contextledger as the session store of the frameworks agents use.

Each adapter is one module and one optional extra; importing ``contextledger`` never
imports a framework, and importing an adapter without its extra raises ``MissingExtra``.

* ``contextledger.adapters.openai_agents`` (``[openai-agents]``): ``LedgerSession``, a
  ``Session`` for the OpenAI Agents SDK.
* ``contextledger.adapters.adk`` (``[adk]``): ``LedgerSessionService``, a Google ADK
  ``BaseSessionService``.
* ``contextledger.adapters.langchain`` (``[langchain]``): a ``BaseChatMessageHistory`` and
  the LangGraph integration.
* ``contextledger.adapters.pydantic_ai`` (``[pydantic-ai]``): message history in and out as
  ``ModelMessage`` lists, and a history processor that fits the token budget.
"""
