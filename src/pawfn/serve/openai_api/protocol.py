"""The OpenAI API's shapes that `pawfn serve` speaks (chat completions, completions, models, errors), as pydantic
models, and how a request becomes pawfn calls: its input, its `RuntimeOptions`, and what it asks that a PAW program
cannot honour (a 400 naming it)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from ...calls.runtime import CallInput
from ...core.images import Image
from ...core.grammar import (
    MAX_CHOICE_CHARS,
    MAX_CHOICES,
    MAX_PATTERN_CHARS,
    ChoicesFormat,
    JsonSchemaFormat,
    JsonSchemaSpec,
    OutputFormat,
    PatternFormat,
)
from ...core.options import MAX_STOP_CHARS, MAX_STOPS, RuntimeOptions
from ...core.protocol import ImagePart, ImageUrl
from ...core.results import StopReason
from ..errors import ApiError

__all__ = [
    "MAX_CHOICES_PER_REQUEST",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatMessage",
    "Completion",
    "CompletionChunk",
    "CompletionRequest",
    "ModelCard",
    "ModelList",
    "Usage",
    "finish_reason",
]

MAX_CHOICES_PER_REQUEST = 16
"""Most choices one request may ask for (`n`, times the prompts of a completions request)."""

_SEED_RANGE = 2**64

_OFF_VALUES: dict[str, tuple[JsonValue, ...]] = {
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "logprobs": (False,),
    "echo": (False,),
    "best_of": (1,),
    "logit_bias": ({},),
    "tools": ([],),
    "functions": ([],),
    "tool_choice": ("none",),
    "function_call": ("none",),
    "store": (False,),
    "parallel_tool_calls": (False, True),  # says how tools are called; without tools it asks nothing
}
"""Parameters of OpenAI's API that pawfn accepts only with the value that asks for nothing (or null); any other value,
and any parameter not named here or in the request's model, is a 400 that names it."""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False
    """Send one more chunk before `[DONE]`: no choices, the request's `usage`."""


class ResponseFormatText(BaseModel):
    type: Literal["text"]


class ResponseFormatJsonObject(BaseModel):
    type: Literal["json_object"]


class ResponseFormatJsonSchema(BaseModel):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema, Field(discriminator="type")]


class StructuredOutputs(BaseModel):
    """Output constraints OpenAI's API has no field for, sent in `extra_body` as vLLM names them: a label from
    `choice`, or text matching `regex`."""

    model_config = ConfigDict(extra="forbid")

    choice: list[Annotated[str, Field(min_length=1, max_length=MAX_CHOICE_CHARS)]] | None = Field(default=None, min_length=1, max_length=MAX_CHOICES)
    regex: str | None = Field(default=None, min_length=1, max_length=MAX_PATTERN_CHARS)


_Stop = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]


class _GenerationRequest(BaseModel):
    """What chat completions and completions share: the program (`model`), sampling, stopping and the output's form."""

    model_config = ConfigDict(extra="allow")  # checked by `unsupported`: a 400 names any parameter pawfn does not honour

    model: str = Field(min_length=1, max_length=512)
    """The program: a name given at start, a lock name, a slug, `user/slug@vN` or a program id."""
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, allow_inf_nan=False)
    """None: 0, the program's greedy decoding (not OpenAI's default of 1)."""
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, allow_inf_nan=False)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    stop: _Stop | list[_Stop] | None = None
    n: int = Field(default=1, ge=1, le=MAX_CHOICES_PER_REQUEST)
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    user: str | None = Field(default=None, max_length=256)
    """An end user's id, accepted as OpenAI's API takes it; pawfn keeps nothing of it."""

    def unsupported(self) -> None:
        """400 naming the first parameter sent that a PAW program cannot honour."""
        for name, value in (self.model_extra or {}).items():
            if name in _OFF_VALUES and (value is None or value in _OFF_VALUES[name]):
                continue
            reason = _NOT_HONOURED.get(name, "it is not a parameter pawfn serves")
            raise ApiError(400, "unsupported_parameter", f"unsupported parameter {name!r}: {reason}; remove it from the request", param=name)
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "invalid_request", "stream_options is only allowed with stream: true", param="stream_options")

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a chunk of the request's `usage`."""
        return self.stream_options is not None and self.stream_options.include_usage

    def limit(self) -> int | None:
        """The most tokens the request asks for (None: as many as the server allows)."""
        return self.max_tokens

    def output_format(self) -> OutputFormat | None:
        """What the output must be: `response_format`, or a label or pattern of `structured_outputs`."""
        given = self.structured_outputs
        if given is not None and self.response_format is not None and not isinstance(self.response_format, ResponseFormatText):
            raise ApiError(400, "invalid_request", "give response_format or structured_outputs, not both", param="structured_outputs")
        if given is not None:
            if (given.choice is None) == (given.regex is None):
                raise ApiError(400, "invalid_request", "structured_outputs takes one of choice or regex", param="structured_outputs")
            if given.choice is not None:
                return ChoicesFormat(choices=tuple(given.choice))
            assert given.regex is not None
            return PatternFormat(pattern=given.regex)
        form = self.response_format
        if isinstance(form, ResponseFormatJsonSchema):
            return JsonSchemaFormat(json_schema=form.json_schema)
        if isinstance(form, ResponseFormatJsonObject):
            return JsonSchemaFormat(json_schema=JsonSchemaSpec.model_validate({"name": "json_object", "schema": {"type": "object"}}))
        return None

    def options(self, choice: int) -> RuntimeOptions:
        """The `RuntimeOptions` of the request's `choice`-th choice (a seed moves on by one per choice, so `n` seeded
        samples differ; greedy choices are the same call)."""
        stops = () if self.stop is None else (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if len(stops) > MAX_STOPS:
            raise ApiError(400, "invalid_request", f"stop has {len(stops)} sequences; give at most {MAX_STOPS}", param="stop")
        seed = None if self.seed is None else (self.seed + choice) % _SEED_RANGE
        return RuntimeOptions(
            max_tokens=self.limit(),
            temperature=self.temperature or 0.0,
            top_p=1.0 if self.top_p is None else self.top_p,
            seed=seed,
            stop=stops,
            response_format=self.output_format(),
        )


_NOT_HONOURED = {
    "tools": "a PAW program calls no tools; it answers its one function's input",
    "functions": "a PAW program calls no functions; it answers its one function's input",
    "tool_choice": "a PAW program calls no tools",
    "function_call": "a PAW program calls no functions",
    "logprobs": "pawfn does not return log probabilities",
    "top_logprobs": "pawfn does not return log probabilities",
    "logit_bias": "pawfn does not bias logits; constrain the output with response_format or structured_outputs",
    "frequency_penalty": "a PAW program decodes without repetition penalties",
    "presence_penalty": "a PAW program decodes without repetition penalties",
    "echo": "pawfn does not echo the prompt",
    "best_of": "pawfn does not rank candidates; ask for n choices",
    "suffix": "a PAW program's template fixes what follows the input",
    "store": "pawfn stores no completions",
    "audio": "a PAW program answers in text",
    "modalities": "a PAW program answers in text",
}


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ImageUrlInPart(BaseModel):
    url: str
    detail: str | None = None


class ImageUrlPart(BaseModel):
    type: Literal["image_url"]
    image_url: ImageUrlInPart


ContentPart = Annotated[TextPart | ImageUrlPart, Field(discriminator="type")]


class ChatMessage(BaseModel):
    """A message of the conversation; only the last `user` message becomes the program's input."""

    model_config = ConfigDict(extra="allow")  # an assistant's tool calls, names: messages other than the input are left out

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None


class ChatCompletionRequest(_GenerationRequest):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=256)
    max_completion_tokens: int | None = Field(default=None, ge=0)

    def limit(self) -> int | None:
        if self.max_tokens is not None and self.max_completion_tokens is not None and self.max_tokens != self.max_completion_tokens:
            raise ApiError(400, "invalid_request", "max_tokens and max_completion_tokens differ; give one", param="max_completion_tokens")
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def call(self) -> tuple[CallInput, list[str]]:
        """The program's input (the last user message: its text, or its parts in order where it holds an image) and
        the roles of the messages left out, in order."""
        users = [index for index, message in enumerate(self.messages) if message.role == "user"]
        if not users:
            raise ApiError(400, "invalid_request", "messages holds no user message; its last one is the program's input", param="messages")
        chosen = users[-1]
        content = self.messages[chosen].content
        left_out: list[str] = [message.role for index, message in enumerate(self.messages) if index != chosen]
        if content is None:
            raise ApiError(400, "invalid_request", f"messages[{chosen}] (the input) has no content", param="messages")
        if isinstance(content, str):
            return content, left_out
        if all(isinstance(part, TextPart) for part in content):
            return "\n".join(part.text for part in content if isinstance(part, TextPart)), left_out
        return tuple(_argument(part, chosen) for part in content), left_out


def _argument(part: TextPart | ImageUrlPart, message: int) -> str | Image:
    """One part of an input message with images: its text, or its image decoded from a `data:` URL."""
    if isinstance(part, TextPart):
        return part.text
    url = part.image_url.url
    if not url.startswith("data:"):
        raise ApiError(
            400, "invalid_image_url", f"messages[{message}]: images are taken inline only, as data: URLs; nothing is fetched", param="messages"
        )
    try:
        return ImagePart(image_url=ImageUrl(url=url)).image()
    except ValueError as exc:  # pydantic's pattern refusal or base64 that does not decode
        problem = f"messages[{message}]: the image's data URL is not base64 image data ({exc})"
        raise ApiError(400, "invalid_image", problem, param="messages") from None


class CompletionRequest(_GenerationRequest):
    """`POST /v1/completions`: `prompt` is the program's input (several: one call each)."""

    prompt: str | Annotated[list[str], Field(max_length=MAX_CHOICES_PER_REQUEST)]

    def inputs(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)


FinishReason = Literal["stop", "length"]


def finish_reason(stop: StopReason) -> FinishReason:
    """OpenAI's name for why a call ended: its end or a stop sequence ("stop"), or a limit ("length")."""
    return "stop" if stop in ("eos", "stop") else "length"


class PromptTokensDetails(BaseModel):
    cached_tokens: int
    """The program's prefix, evaluated once and reused by every call."""


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: Delta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: FinishReason | None
    logprobs: None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


CompletionChunk = Completion
"""A streamed completion's chunk: OpenAI sends the same object, one choice's new text at a time."""


class ModelCard(BaseModel):
    """A served program as OpenAI lists a model, and as vLLM lists a LoRA module: `parent` the base, `root` the
    program."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    root: str
    parent: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
