"""Token counting. Counts are taken once, at append, and stored with the counter's ``name``.

``name`` identifies counter *and* encoding (``tiktoken:o200k_base``,
``litellm:anthropic``, ``chars:4``) so a stored count can always be told apart
from one taken with a different tokenizer.

Message accounting (every counter, same rules; follows the OpenAI cookbook's
``num_tokens_from_messages`` and extends it to what providers bill besides text):

* ``count_message`` = :data:`TOKENS_PER_MESSAGE` (3) + role + content blocks
  + ``name`` (+ :data:`TOKENS_PER_NAME`, 1) + tool calls + reasoning text;
* ``count_messages(ms)`` = ``sum(count_message(m) for m in ms)`` +
  :data:`REPLY_PRIMING` (3, "every reply is primed with <|start|>assistant<|message|>").
  Hence ``count_messages(a + b) == count_messages(a) + count_messages(b) - REPLY_PRIMING``.
* OpenAI ``tool_calls`` / legacy ``function_call``: function name + arguments text.
* Content blocks: ``text``; ``image_url``/``image``/``input_image`` via
  :mod:`contextledger.core.images` (provider from the counter's model); Anthropic
  ``tool_use`` (name + compact JSON of ``input``); ``tool_result`` (its content,
  string or blocks, recursively); ``thinking``/``reasoning``/``redacted_thinking``
  (their text). Unknown block types: their compact JSON.
* Ids (``tool_call_id``, block ``id``) and signatures are opaque links, not prompt
  text, and are not counted.

Never a network call: tiktoken encodings are built from the BPE files litellm ships
(hash-checked), and litellm itself is used only by :class:`LitellmCounter`; both come
through :mod:`contextledger.core.catalogue`, which the shell fills (core reads no file).
Importing this module imports neither tiktoken nor litellm.
"""

from __future__ import annotations

import json
import math
import re
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from contextledger.core import catalogue
from contextledger.core.images import Provider, image_tokens, provider_for_model
from contextledger.core.model_limits import bare_model_name
from contextledger.core.providers import model_family
from contextledger.errors import ConfigError

if TYPE_CHECKING:
    import tiktoken

__all__ = [
    "REPLY_PRIMING",
    "TOKENS_PER_MESSAGE",
    "TOKENS_PER_NAME",
    "CallableCounter",
    "CharsCounter",
    "LitellmCounter",
    "TiktokenCounter",
    "TokenCounter",
    "encoding_for_model",
    "get_counter",
    "get_encoding",
]

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens offline; ``name`` is stored with every count it produced."""

    name: str

    def count_text(self, text: str) -> int:
        """Tokens of a plain string."""
        ...

    def count_message(self, message: Mapping[str, Any]) -> int:
        """Tokens of one chat message, its role, tool calls and images included."""
        ...

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Tokens of a list of messages, as a request would carry them."""
        ...


# --- message accounting shared by every counter ---------------------------------------


def _json(value: Any) -> str:
    """Compact JSON: how tool inputs reach the model, with no padding to overcount."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


_IMAGE_TYPES = frozenset({"image_url", "image", "input_image"})
_TEXT_TYPES = frozenset({"text", "input_text", "output_text"})


class _MessageCounter:
    """Message/block accounting on top of a subclass's ``count_text``."""

    name: str
    model: str | None = None

    def count_text(self, text: str) -> int:
        raise NotImplementedError

    @property
    def image_provider(self) -> Provider:
        return provider_for_model(self.model)

    def _count_value(self, value: Any) -> int:
        if value is None:
            return 0
        if isinstance(value, str):
            return self.count_text(value)
        return self.count_text(_json(value))

    def _count_content(self, content: Any) -> int:
        if content is None:
            return 0
        if isinstance(content, str):
            return self.count_text(content)
        if isinstance(content, Mapping):
            return self._count_block(content)
        if isinstance(content, Sequence) and not isinstance(content, bytes | bytearray):
            return sum(self._count_block(block) for block in content)
        return self.count_text(_json(content))

    def _count_block(self, block: Any) -> int:
        if isinstance(block, str):
            return self.count_text(block)
        if not isinstance(block, Mapping):
            return self.count_text(_json(block))
        kind = block.get("type")
        if kind in _TEXT_TYPES or (kind is None and isinstance(block.get("text"), str)):
            return self._count_value(block.get("text"))
        if kind in _IMAGE_TYPES:
            return image_tokens(block, self.image_provider)
        if kind == "tool_use":
            return self._count_value(block.get("name")) + self.count_text(
                _json(block.get("input", {}))
            )
        if kind == "tool_result":
            return self._count_content(block.get("content"))
        if kind == "thinking":
            return self._count_value(block.get("thinking"))
        if kind == "redacted_thinking":
            return self._count_value(block.get("data"))
        if kind == "reasoning":
            return self._count_reasoning(block)
        return self.count_text(_json(block))

    def _count_reasoning(self, block: Mapping[str, Any]) -> int:
        # OpenAI Responses puts reasoning in ``summary``/``content`` lists; others in text.
        total = 0
        for key in ("text", "reasoning", "thinking"):
            total += self._count_value(block.get(key)) if isinstance(block.get(key), str) else 0
        for key in ("summary", "content"):
            parts = block.get(key)
            if isinstance(parts, Sequence) and not isinstance(parts, str):
                total += sum(self._count_block(part) for part in parts)
        return total

    def _count_tool_call(self, call: Any) -> int:
        if not isinstance(call, Mapping):
            return self.count_text(_json(call))
        function = call.get("function", call)
        if not isinstance(function, Mapping):
            return self.count_text(_json(call))
        arguments = function.get("arguments")
        return self._count_value(function.get("name")) + self._count_value(arguments)

    def _role_tokens(self, role: Any) -> int:
        cache: dict[str, int] = self.__dict__.setdefault("_roles", {})
        if isinstance(role, str) and role in cache:
            return cache[role]
        tokens = self._count_value(role)
        if isinstance(role, str) and len(cache) < 16:
            cache[role] = tokens
        return tokens

    def count_message(self, message: Mapping[str, Any]) -> int:
        """Tokens one message adds to a prompt (see the module docstring for the rules)."""
        total = TOKENS_PER_MESSAGE + self._role_tokens(message.get("role"))
        total += self._count_content(message.get("content"))
        if message.get("name"):
            total += self._count_value(message["name"]) + TOKENS_PER_NAME
        tool_calls = message.get("tool_calls")
        if isinstance(tool_calls, Sequence) and not isinstance(tool_calls, str):
            total += sum(self._count_tool_call(call) for call in tool_calls)
        if message.get("function_call"):
            total += self._count_tool_call(message["function_call"])
        for key in ("reasoning_content", "thinking"):
            value = message.get(key)
            if isinstance(value, str):
                total += self.count_text(value)
        return total

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Prompt tokens for ``messages``: the per-message sum plus :data:`REPLY_PRIMING`."""
        return sum(self.count_message(m) for m in messages) + REPLY_PRIMING

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


# --- tiktoken encodings, offline -------------------------------------------------------

_ENCODING_URLS = {
    "o200k_base": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
    "cl100k_base": "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
}
_encodings: dict[str, tiktoken.Encoding] = {}
_encodings_lock = threading.Lock()


def get_encoding(name: str) -> tiktoken.Encoding:
    """A tiktoken encoding built offline; cached per name, built once (thread-safe).

    Uses the constructor from ``tiktoken_ext.openai_public`` (so ``pat_str`` and the
    special tokens are tiktoken's own) with its loader swapped for :func:`catalogue.bpe`
    (litellm's bundled files, read by the shell) in a private copy of its globals:
    nothing global is patched and ``TIKTOKEN_CACHE_DIR`` is neither read nor set.
    """
    encoding = _encodings.get(name)
    if encoding is not None:
        return encoding
    if name not in _ENCODING_URLS:
        raise ConfigError(
            f"unknown tiktoken encoding {name!r}; bundled: {sorted(_ENCODING_URLS)}",
            key="token_counter",
        )
    with _encodings_lock:
        encoding = _encodings.get(name)
        if encoding is None:
            import tiktoken
            from tiktoken_ext import openai_public

            constructor = getattr(openai_public, name)
            offline = types.FunctionType(
                constructor.__code__,
                {**vars(openai_public), "load_tiktoken_bpe": catalogue.bpe},
                constructor.__name__,
            )
            encoding = tiktoken.Encoding(**offline())
            _encodings[name] = encoding
    return encoding


_O200K_FAMILY = re.compile(
    r"^(?:ft:)?(?:gpt-4o|chatgpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|gpt-oss|o1|o3|o4)(?:$|[-.:@_])"
)


def encoding_for_model(model: str | None) -> str:
    """tiktoken encoding for ``model``: o200k_base for gpt-4o/4.1/4.5/5, o1/o3/o4 (any
    provider prefix, dated or not); cl100k_base for everything else."""
    return "o200k_base" if _O200K_FAMILY.match(bare_model_name(model)) else "cl100k_base"


# --- counters --------------------------------------------------------------------------


class TiktokenCounter(_MessageCounter):
    """Exact for OpenAI models; the cl100k approximation for everything else."""

    def __init__(self, model: str | None = None, *, encoding: str | None = None) -> None:
        self.model = model
        self.encoding_name = encoding or encoding_for_model(model)
        if self.encoding_name not in _ENCODING_URLS:
            raise ConfigError(f"unknown tiktoken encoding {encoding!r}", key="token_counter")
        self.name = f"tiktoken:{self.encoding_name}"
        self._encoding: tiktoken.Encoding | None = None

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        encoding = self._encoding
        if encoding is None:
            encoding = self._encoding = get_encoding(self.encoding_name)
        # encode_ordinary: special-token text in user content is just text.
        return len(encoding.encode_ordinary(text))


class LitellmCounter(_MessageCounter):
    """``litellm.token_counter`` for a model, offline.

    Claude models use the Anthropic tokenizer litellm bundles
    (``litellm:anthropic``; passed explicitly, since with HF downloads disabled
    litellm would otherwise fall back to cl100k). Other models get litellm's own
    tiktoken choice for the bare model name (``litellm:o200k_base`` ...); resolving
    that name imports litellm (~2 s, once per process) at construction. Messages are
    counted with this module's rules over ``count_text``, never litellm's (which can
    fetch image URLs).
    """

    def __init__(self, model: str) -> None:
        if not model:
            raise ConfigError("the litellm counter needs a model name", key="token_counter")
        self.model = model
        self._litellm_model = bare_model_name(model)
        self._anthropic = model_family(model) == "anthropic"
        self._lock = threading.Lock()
        self._litellm: Any = None
        self._custom: dict[str, Any] | None = None
        if self._anthropic:
            self.name = "litellm:anthropic"
        else:
            litellm = self._prepare()
            token_counter = litellm.litellm_core_utils.token_counter
            encoding: str = token_counter.openai_tokenizer_encoding_name(self._litellm_model)
            self.name = f"litellm:{encoding}"

    def _prepare(self) -> Any:
        """Import litellm (offline-configured) and load the bundled tokenizer, once."""
        if self._litellm is not None:
            return self._litellm
        with self._lock:
            if self._litellm is None:
                litellm = catalogue.litellm()
                if self._anthropic:
                    self._custom = _anthropic_tokenizer(litellm)
                self._litellm = litellm
        return self._litellm

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        litellm = self._prepare()
        return int(
            litellm.token_counter(
                model=self._litellm_model, text=text, custom_tokenizer=self._custom
            )
        )


_anthropic: dict[str, Any] = {}


def _anthropic_tokenizer(litellm: Any) -> dict[str, Any]:
    """litellm's bundled Anthropic tokenizer, built once per process (like the tiktoken
    encodings): building it holds the GIL for a good part of a second, so a counter per
    session must not build it again (``warm_up`` builds it before the loop needs it)."""
    with _encodings_lock:
        if not _anthropic:
            utils = litellm.utils
            _anthropic.update(utils.create_tokenizer(utils.claude_json_str))
    return _anthropic


class CharsCounter(_MessageCounter):
    """Character-ratio estimator: fast, dependency-free, CJK-aware.

    Each CJK ideograph, kana, Hangul syllable or full-width form counts as one token
    (BPE vocabularies give these scripts ~1 token per character, so the usual
    ``len/4`` undercounts CJK text 3-4x); everything else counts
    ``ceil(chars / chars_per_token)``.
    """

    def __init__(self, chars_per_token: float = 4.0, *, model: str | None = None) -> None:
        if isinstance(chars_per_token, bool) or not chars_per_token > 0:
            raise ConfigError(
                f"chars_per_token must be > 0, got {chars_per_token!r}", key="token_counter"
            )
        self.chars_per_token = float(chars_per_token)
        self.model = model
        self.name = f"chars:{self.chars_per_token:g}"

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        if text.isascii():
            return math.ceil(len(text) / self.chars_per_token)
        wide = len(_WIDE_CHARS.findall(text))
        return wide + math.ceil((len(text) - wide) / self.chars_per_token)


_WIDE_CHARS = re.compile(
    "["
    "\u1100-\u11ff"  # Hangul Jamo
    "\u2e80-\u2fdf"  # CJK radicals, Kangxi radicals
    "\u3000-\u303f"  # CJK symbols and punctuation
    "\u3040-\u309f"  # Hiragana
    "\u30a0-\u30ff"  # Katakana
    "\u3100-\u31ff"  # Bopomofo, Hangul compatibility Jamo, Kanbun, Katakana ext.
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uac00-\ud7af"  # Hangul syllables
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\uff00-\uffef"  # half-width and full-width forms
    "\U00020000-\U0003134f"  # CJK extensions B-G
    "]"
)


class CallableCounter(_MessageCounter):
    """Any ``fn(text) -> int`` as a counter, with this module's message accounting."""

    def __init__(
        self, fn: Callable[[str], int], name: str | None = None, *, model: str | None = None
    ) -> None:
        if not callable(fn):
            raise ConfigError("token counter must be callable", key="token_counter")
        self._fn = fn
        self.model = model
        self.name = name or f"callable:{getattr(fn, '__qualname__', type(fn).__name__)}"

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        count = self._fn(text)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError(
                f"token counter {self.name} returned {count!r}, expected an int >= 0",
                key="token_counter",
            )
        return count


# --- factory -----------------------------------------------------------------------------


def get_counter(
    spec: str | Callable[[str], int] | TokenCounter = "auto", model: str | None = None
) -> TokenCounter:
    """Build a counter from config.

    ``spec``: ``"auto"`` | ``"tiktoken"`` | ``"tiktoken:<encoding>"`` | ``"litellm"`` |
    ``"chars"`` | ``"chars:<ratio>"`` | a ``TokenCounter`` (returned as is) | any
    ``fn(text) -> int``. ``"auto"`` picks the most accurate offline tokenizer: tiktoken
    for OpenAI families, litellm's bundled Anthropic tokenizer for ``claude*``,
    otherwise tiktoken cl100k_base as the approximation. Unknown spec: ``ConfigError``.
    """
    if isinstance(spec, str):
        key = spec.strip().lower()
        kind, _, arg = key.partition(":")
        if key == "auto":
            family = model_family(model)
            if family == "anthropic":
                return LitellmCounter(model or "claude")
            if family == "openai":
                return TiktokenCounter(model)
            return TiktokenCounter(model, encoding="cl100k_base")
        if kind == "tiktoken":
            return TiktokenCounter(model, encoding=arg or None)
        if key == "litellm":
            if not model:
                raise ConfigError("token_counter 'litellm' needs a model", key="token_counter")
            return LitellmCounter(model)
        if kind == "chars":
            if not arg:
                return CharsCounter(model=model)
            try:
                ratio = float(arg)
            except ValueError:
                raise ConfigError(f"bad chars ratio in {spec!r}", key="token_counter") from None
            if not math.isfinite(ratio):
                raise ConfigError(f"bad chars ratio in {spec!r}", key="token_counter")
            return CharsCounter(ratio, model=model)
        raise ConfigError(
            f"unknown token counter {spec!r}: use auto, tiktoken, litellm, chars[:ratio] "
            "or a callable",
            key="token_counter",
        )
    if isinstance(spec, TokenCounter):
        return spec
    if callable(spec):
        return CallableCounter(spec, model=model)
    raise ConfigError(f"unknown token counter {spec!r}", key="token_counter")
