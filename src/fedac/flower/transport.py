"""fedac payloads <-> Flower records, exactly.

An algorithm's payloads, uploads and client states are dicts of tensors, possibly nested (FedKAD
sends {"prototypes": ..., "known": ...}), possibly with lists, scalars or None in them. On the wire
they become one `ArrayRecord` (every tensor, serialised by Flower as a NumPy `.npy` buffer, so
dtype, shape and every bit survive) and, unless the object is a plain flat dict of tensors, one
`ConfigRecord` holding its layout as JSON. A flat dict of tensors (a model's state_dict) is sent
under its own keys, so Flower's built-in strategies can aggregate it key by key.

Only dtypes that NumPy can represent travel (float16/32/64, integers, bool, complex); a bfloat16 or
float8 tensor raises `TransportError` naming the entry, rather than being silently converted.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedac.errors import FedacError

#: ConfigRecord key that holds the layout JSON.
LAYOUT_KEY = "layout"
_TENSOR = "$tensor"
_LIST = "$list"
_TUPLE = "$tuple"
_DICT = "$dict"


class TransportError(FedacError):
    """A payload cannot be converted to or from Flower records."""


def _is_flat(obj: Any) -> bool:
    return isinstance(obj, dict) and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()
    )


def _to_array(tensor: torch.Tensor, where: str) -> Array:
    try:
        ndarray = tensor.detach().cpu().numpy()
    except TypeError as exc:
        raise TransportError(
            f"tensor '{where}' has dtype {tensor.dtype}, which Flower's NumPy serialisation cannot "
            f"carry ({exc}); cast it to float32 in the algorithm before it leaves the client or "
            "server"
        ) from None
    if not ndarray.flags.c_contiguous:
        ndarray = ndarray.copy(order="C")  # (np.ascontiguousarray would turn a 0-d array into 1-d)
    return Array(ndarray)


def _to_tensor(array: Array) -> torch.Tensor:
    ndarray = array.numpy()
    if not ndarray.flags.writeable:  # torch.from_numpy warns on read-only buffers
        ndarray = ndarray.copy()
    return torch.from_numpy(ndarray)


def _encode(obj: Any, path: str, arrays: dict[str, Array]) -> Any:
    """Tree of JSON values with tensors replaced by {"$tensor": key}; tensors collected in
    `arrays`."""
    if isinstance(obj, torch.Tensor):
        key = str(len(arrays))
        arrays[key] = _to_array(obj, path)
        return {_TENSOR: key}
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if not isinstance(k, str):
                raise TransportError(
                    f"payload entry '{path}' has a non-string key {k!r}; use string keys"
                )
            items.append([k, _encode(v, f"{path}/{k}" if path else k, arrays)])
        return {_DICT: items}
    if isinstance(obj, (list, tuple)):
        tag = _LIST if isinstance(obj, list) else _TUPLE
        return {tag: [_encode(v, f"{path}[{i}]", arrays) for i, v in enumerate(obj)]}
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        # JSON has no NaN / Inf: keep the exact value as its repr.
        return {"$float": repr(obj)}
    raise TransportError(
        f"payload entry '{path or '<root>'}' has type {type(obj).__name__}; "
        "payloads may hold tensors, dicts, lists, tuples, numbers, strings and None"
    )


def _decode(node: Any, arrays: ArrayRecord) -> Any:
    if isinstance(node, dict):
        if _TENSOR in node:
            return _to_tensor(arrays[node[_TENSOR]])
        if _DICT in node:
            return {k: _decode(v, arrays) for k, v in node[_DICT]}
        if _LIST in node:
            return [_decode(v, arrays) for v in node[_LIST]]
        if _TUPLE in node:
            return tuple(_decode(v, arrays) for v in node[_TUPLE])
        if "$float" in node:
            return float(node["$float"])
        raise TransportError(f"unknown layout node {node!r}")
    return node


def to_records(obj: Any) -> tuple[ArrayRecord, ConfigRecord | None]:
    """Object -> (ArrayRecord, layout ConfigRecord or None for a flat dict of tensors)."""
    if _is_flat(obj):
        return ArrayRecord({k: _to_array(v, k) for k, v in obj.items()}), None
    arrays: dict[str, Array] = {}
    layout = _encode(obj, "", arrays)
    return ArrayRecord(arrays), ConfigRecord({LAYOUT_KEY: json.dumps(layout)})


def from_records(arrays: ArrayRecord | None, layout: ConfigRecord | None = None) -> Any:
    """Inverse of `to_records`. Without a layout the ArrayRecord is read as a flat dict of
    tensors."""
    if layout is None or LAYOUT_KEY not in layout:
        if arrays is None:
            raise TransportError("message carries neither arrays nor a layout: nothing to decode")
        return {k: _to_tensor(v) for k, v in arrays.items()}
    try:
        tree = json.loads(str(layout[LAYOUT_KEY]))
    except json.JSONDecodeError as exc:
        raise TransportError(f"payload layout is not valid JSON ({exc})") from None
    return _decode(tree, arrays if arrays is not None else ArrayRecord())


def put(content: RecordDict, name: str, obj: Any) -> None:
    """Store `obj` in a RecordDict under `name` (arrays) and `name + '.layout'` (layout, when
    needed)."""
    arrays, layout = to_records(obj)
    content[name] = arrays
    if layout is not None:
        content[f"{name}.layout"] = layout
    elif f"{name}.layout" in content:
        del content[f"{name}.layout"]


def get(content: RecordDict, name: str) -> Any:
    """Inverse of `put`; raises TransportError when `name` is absent."""
    if name not in content and f"{name}.layout" not in content:
        raise TransportError(
            f"message has no record '{name}' (it holds: {', '.join(content.keys()) or 'nothing'})"
        )
    arrays = content.array_records.get(name)
    layout = content.config_records.get(f"{name}.layout")
    return from_records(arrays, layout)


def digest(obj: Any) -> str:
    """Short stable hash of a payload / state (names, dtypes, shapes and bytes of every tensor)."""
    h = hashlib.sha256()

    def feed(node: Any, path: str) -> None:
        if isinstance(node, torch.Tensor):
            t = node.detach().cpu().contiguous()
            h.update(f"{path}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(
                t.numpy().tobytes()
                if t.dtype != torch.bfloat16
                else t.view(torch.int16).numpy().tobytes()
            )
        elif isinstance(node, dict):
            for k in sorted(node):
                feed(node[k], f"{path}/{k}")
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                feed(v, f"{path}[{i}]")
        else:
            h.update(f"{path}={node!r}|".encode())

    feed(obj, "")
    return h.hexdigest()[:16]
