"""The binary half of the Tinker wire format: protobuf messages of the pinned ``tinker`` SDK.

Three messages are protobuf rather than JSON: the body of ``forward_backward`` (a
``ForwardBackwardRequest``) and the results of ``forward_backward`` and ``asample`` (a
``ForwardBackwardOutput`` and a ``SampleResponse``). They are read and written with the SDK's
own generated module, so the server speaks exactly the schema the client was built with.
Arrays travel as little-endian bytes: token ids ``int32``, tensors ``float32`` / ``int64``
(2-D ones possibly as CSR), per-datum outputs concatenated with byte offsets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ardea.errors import ArdeaError

SDK_VERSION = "0.38.0"  # the tinker SDK this server is written and tested against
PROTOBUF = "application/x-protobuf"


class WireError(ArdeaError):
    """A request the server cannot take: the message names the field and the value (400)."""


class Busy(WireError):
    """A request over a limit on work in flight: the client may send it again (429)."""


def proto():
    """The SDK's generated protobuf module (``pip install tinker``; the extra ``ardea[tinker]``)."""
    try:
        from tinker.proto import tinker_public_pb2
    except ImportError as exc:  # pragma: no cover - the dependency is declared
        raise ArdeaError(
            f"the Tinker API needs the tinker SDK {SDK_VERSION}: pip install 'ardea[tinker]'"
        ) from exc
    return tinker_public_pb2


_DTYPES = {1: np.float32, 2: np.int64, 3: np.int32}


@dataclass
class WireDatum:
    """One ``Datum``: its input ``tokens`` and ``inputs`` (``loss_fn_inputs`` as arrays)."""

    tokens: list[int]
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class ForwardBackwardCall:
    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float | str]
    forward_only: bool
    data: list[WireDatum]


MAX_TENSOR_VALUES = 2**24  # a datum's input tensors are one value per token


def _array(name: str, raw: bytes, dtype, what: str) -> np.ndarray:
    if len(raw) % np.dtype(dtype).itemsize:
        raise WireError(f"loss_fn_inputs[{name!r}].{what} has {len(raw)} bytes, not a whole "
                        f"number of {np.dtype(dtype).name} values")  # fmt: skip
    return np.frombuffer(raw, dtype)


def tensor_array(name: str, tensor) -> np.ndarray:
    """A ``Tensor`` message as an array of its shape (dense, or CSR with absent cells 0)."""
    dtype = _DTYPES.get(tensor.dtype)
    if dtype is None:
        raise WireError(f"loss_fn_inputs[{name!r}] has dtype {tensor.dtype}, not float32/int64")
    shape = list(tensor.shape)
    if any(d < 0 for d in shape) or math.prod(shape) > MAX_TENSOR_VALUES:
        raise WireError(f"loss_fn_inputs[{name!r}] has shape {shape}: at most "
                        f"{MAX_TENSOR_VALUES} values")  # fmt: skip
    if tensor.HasField("sparse_csr"):
        return _csr(name, tensor.sparse_csr, dtype, shape)
    values = _array(name, tensor.dense, dtype, "dense")
    if shape and math.prod(shape) != values.size:
        raise WireError(f"loss_fn_inputs[{name!r}] holds {values.size} values, not shape {shape}")
    return values.reshape(shape) if shape else values


def _csr(name: str, csr, dtype, shape: list[int]) -> np.ndarray:
    """A CSR tensor made dense, its row pointers and column indices checked first."""
    values = _array(name, csr.values, dtype, "values")
    rows = _array(name, csr.crow_indices, np.int64, "crow_indices")
    cols = _array(name, csr.col_indices, np.int64, "col_indices")
    fits = len(shape) == 2 and len(rows) == shape[0] + 1 and len(cols) == len(values)
    fits = fits and rows[0] == 0 and rows[-1] == len(values) and bool(np.all(np.diff(rows) >= 0))
    if not fits or (cols.size and not (cols.min() >= 0 and cols.max() < shape[1])):
        raise WireError(f"loss_fn_inputs[{name!r}]: CSR data that does not fit shape {shape} "
                        "(row pointers, column indices or value count)")  # fmt: skip
    dense = np.zeros(shape, dtype)
    for r in range(shape[0]):
        dense[r, cols[rows[r] : rows[r + 1]]] = values[rows[r] : rows[r + 1]]
    return dense


def _tokens(index: int, datum) -> list[int]:
    tokens: list[int] = []
    for chunk in datum.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise WireError(f"data[{index}].model_input has a {kind!r} chunk: only text is served")
        raw = chunk.encoded_text.tokens
        if len(raw) % 4:
            raise WireError(f"data[{index}].model_input: {len(raw)} bytes are not int32 tokens")
        tokens.extend(np.frombuffer(raw, np.int32).tolist())
    return tokens


def parse_forward_backward(body: bytes):
    """The ``ForwardBackwardRequest`` of a request body (decompressed already, by the
    server's HTTP layer); its data are read by :func:`forward_backward_call`."""
    message = proto().ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except Exception as exc:  # protobuf's DecodeError
        raise WireError(
            f"the forward_backward body is not a ForwardBackwardRequest: {exc}"
        ) from exc
    return message


def forward_backward_call(message) -> ForwardBackwardCall:
    """The call a parsed ``ForwardBackwardRequest`` asks for, its arrays checked."""
    config: dict[str, float | str] = dict(message.loss_fn_config)
    for key, value in message.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else value.number
    data = [
        WireDatum(
            _tokens(i, d), {k: tensor_array(k, t) for k, t in d.loss_fn_inputs.items()}
        )
        for i, d in enumerate(message.data)
    ]  # fmt: skip
    return ForwardBackwardCall(
        message.model_id, message.seq_id, message.loss_fn, config, message.forward_only, data
    )


def _batched(record, name: str, arrays: list[np.ndarray]) -> None:
    tensor = record.fields[name]
    arrays = [np.ascontiguousarray(a, np.float32) for a in arrays]
    tensor.data = b"".join(a.tobytes() for a in arrays)
    tensor.offsets = np.cumsum([0] + [a.nbytes for a in arrays], dtype=np.int64).tobytes()
    tensor.dtype = proto().DTYPE_FLOAT32


def forward_backward_output(
    logprobs: list[np.ndarray], losses: list[np.ndarray], metrics: dict[str, float]
) -> bytes:
    """The ``ForwardBackwardOutput`` of one request: per datum its target tokens' log-probs
    and elementwise loss (each shaped as its ``target_tokens``), and ``metrics`` whose keys
    are ``name:reduction`` (the client merges chunks by the reduction)."""
    pb = proto()
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    record = out.loss_fn_outputs.add()
    record.num_datums = len(logprobs)
    _batched(record, "logprobs", logprobs)
    _batched(record, "elementwise_loss", losses)
    for key, value in metrics.items():
        out.metrics[key] = float(value)
    return out.SerializeToString()


def sample_response(
    sequences: list[tuple[list[int], list[float], bool]], prompt_logprobs: list[float] | None
) -> bytes:
    """A ``SampleResponse``: per sample ``(tokens, logprobs, stopped)`` (``stopped``: it
    ended on a stop token or string, else it ran out of tokens) and the prompt's log-probs
    (NaN first: the first token has no prefix) when asked for."""
    pb = proto()
    out = pb.SampleResponse()
    for tokens, logprobs, stopped in sequences:
        seq = out.sequences.add()
        seq.stop_reason = pb.STOP_REASON_STOP if stopped else pb.STOP_REASON_LENGTH
        seq.tokens = np.asarray(tokens, np.int32).tobytes()
        seq.logprobs = np.asarray(logprobs, np.float32).tobytes()
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(prompt_logprobs, np.float32).tobytes()
    return out.SerializeToString()
