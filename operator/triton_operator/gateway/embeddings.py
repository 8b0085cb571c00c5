"""OpenAI's embeddings (POST /v1/embeddings) <-> an embedding model's generate endpoint (pure).

A service with `spec.openai.task: embeddings` names a Triton model (any format) that takes
`text_input`, a batch of strings, and answers `embedding`, one vector per string (Triton's generate
extension returns it flattened, so its length must be a whole multiple of the batch), and
`prompt_tokens` (the tokens it read, for usage and the key's tokensPerMinute). `input` is a string or
a list of up to MAX_INPUTS strings; token arrays are refused (the gateway does not tokenize).
`encoding_format` float gives lists of numbers, base64 the little-endian float32 bytes (what the
official clients ask for by default).
"""

from __future__ import annotations

import base64
import math
import struct
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from . import openai_schema as oai
from . import translate as t
from .auth import BYTES_PER_TOKEN

MAX_INPUTS = 256
MAX_INPUT_CHARS = 65_536
Text = Annotated[str, StringConstraints(min_length=1, max_length=MAX_INPUT_CHARS)]


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(..., min_length=1, max_length=253)
    input: Text | list[Text] = Field(...)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = Field(None, max_length=512)

    @field_validator("encoding_format", mode="before")
    @classmethod
    def _null_is_float(cls, value: Any) -> Any:
        return "float" if value is None else value   # OpenAI's API takes null as its default

    @field_validator("input", mode="before")
    @classmethod
    def _texts(cls, value: Any) -> Any:
        # Checked here, item by item, so that the message says what is wrong: the union's own
        # errors named its internal type ("constrained-str") and called an empty string not one.
        if isinstance(value, list):
            if not value or len(value) > MAX_INPUTS:
                raise ValueError(f"give 1 to {MAX_INPUTS} strings")
            if any(isinstance(v, list) or (isinstance(v, int) and not isinstance(v, bool)) for v in value):
                raise ValueError("token arrays are not supported: send text")
            if not all(isinstance(v, str) for v in value):
                raise ValueError("give strings")
        if value == "" or (isinstance(value, list) and "" in value):
            raise ValueError("an empty string has no embedding")
        return value

    @field_validator("dimensions")
    @classmethod
    def _dimensions(cls, value: int | None) -> int | None:
        if value is not None:
            raise ValueError(f"the model's own dimension is served; shortened embeddings are not supported"
                             f"{oai.GATEWAY_REFUSES}")
        return value

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


def parse(raw: bytes | bytearray, checked: bool = False) -> EmbeddingsRequest:
    return oai.parse_body(raw, EmbeddingsRequest, checked)


def estimated_tokens(req: EmbeddingsRequest) -> int:
    """The tokens the model would read for `req`, estimated without its tokenizer: one per
    BYTES_PER_TOKEN bytes of UTF-8 text, rounded up (what a request whose client left is charged)."""
    return sum(-(-len(text.encode("utf-8", "surrogatepass")) // BYTES_PER_TOKEN) for text in req.texts())


def generate_body(req: EmbeddingsRequest) -> dict[str, Any]:
    return {"text_input": req.texts()}


def _bad(why: str) -> oai.OpenAIError:
    return oai.OpenAIError(502, f"the embedding model's answer {why}", "upstream_error", code="upstream_failed")


def _finite(x: Any) -> bool:
    """A JSON number a float holds (an integer of hundreds of digits does not: isfinite overflows)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def vectors(answer: Any, count: int) -> tuple[list[list[float]], int | None]:
    """The `count` vectors of a generate answer, and the prompt tokens it reports (None: none)."""
    if not isinstance(answer, dict):
        raise _bad("is not a JSON object")
    if "error" in answer:
        raise t.model_error(answer["error"])
    flat = answer.get("embedding")
    if not isinstance(flat, list) or not flat or len(flat) % count:
        raise _bad(f"has no embedding output of {count} vectors")
    if not all(_finite(x) for x in flat):
        raise _bad("holds an embedding value that is not a finite number")
    size = len(flat) // count
    rows = [[float(x) for x in flat[i * size:(i + 1) * size]] for i in range(count)]
    tokens = answer.get("prompt_tokens")
    if isinstance(tokens, list):
        # a count per input; one that is no count (negative, or past any model's) makes the sum none
        counts = [t.token_count(x) for x in tokens]
        tokens = sum(counts) if counts and None not in counts else None   # type: ignore[arg-type]
    return rows, t.token_count(tokens)


def encoded(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "base64":
        try:
            return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        except (OverflowError, struct.error):
            raise _bad("holds a value past float32's range, which base64 embeddings carry") from None
    return vector


def response(req: EmbeddingsRequest, model_id: str, rows: list[list[float]], tokens: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {"object": "list", "model": model_id,
                           "data": [{"object": "embedding", "index": i, "embedding": encoded(v, req.encoding_format)}
                                    for i, v in enumerate(rows)]}
    out["usage"] = {"prompt_tokens": tokens or 0, "total_tokens": tokens or 0}
    return out
