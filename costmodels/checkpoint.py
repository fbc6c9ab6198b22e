"""Checkpoints: one ``.npz`` of parameter arrays plus JSON metadata, never pickle.

The metadata (model kind, constructor arguments, training state) is stored inside the same file as a
UTF-8 byte array under the key ``__meta__``, so a checkpoint is a single file that
``np.load(path, allow_pickle=False)`` reads.
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from typing import Any

import jax
import numpy as np

_META_KEY = "__meta__"
FORMAT_VERSION = 1


def _path_key(path: tuple[Any, ...]) -> str:
    """'net/enc1/kernel' from a jax key path."""
    parts = []
    for entry in path:
        for attr in ("key", "idx", "name"):
            if hasattr(entry, attr):
                parts.append(str(getattr(entry, attr)))
                break
        else:
            parts.append(str(entry))
    return "/".join(parts)


def flatten_params(tree: Any) -> dict[str, np.ndarray]:
    """A params pytree as ``{'a/b/c': array}``.

    Example:
        >>> flatten_params({"net": {"w": np.ones(2)}, "norm": {"m": np.zeros(1)}})
        {'net/w': array([1., 1.]), 'norm/m': array([0.])}
    """
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {_path_key(path): np.asarray(leaf) for path, leaf in leaves}


def unflatten_params(template: Any, flat: dict[str, np.ndarray]) -> Any:
    """Fills the structure of ``template`` with arrays from ``flat``, checking names and shapes.

    Example:
        >>> unflatten_params({"w": np.zeros(2)}, {"w": np.ones(2)})
        {'w': array([1., 1.])}
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    names = [_path_key(path) for path, _ in leaves]
    missing = sorted(set(names) - set(flat))
    unexpected = sorted(set(flat) - set(names))
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match model: missing {missing}, unexpected {unexpected}")
    values = []
    for name, (_, leaf) in zip(names, leaves):
        value = np.asarray(flat[name])
        if value.shape != np.shape(leaf):
            raise ValueError(f"{name}: checkpoint shape {value.shape}, model shape {np.shape(leaf)}")
        values.append(value.astype(np.asarray(leaf).dtype))
    return jax.tree_util.tree_unflatten(treedef, values)


def save_npz(path: str | os.PathLike, params: Any, meta: dict[str, Any]) -> None:
    """Writes ``params`` (a pytree) and ``meta`` (JSON-able) to one ``.npz`` file.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "m.npz")
        >>> save_npz(p, {"w": np.ones(2)}, {"kind": "demo"})
        >>> load_npz(p)[1]["kind"]
        'demo'
    """
    arrays = flatten_params(params)
    if _META_KEY in arrays:
        raise ValueError(f"parameter name {_META_KEY!r} is reserved")
    meta = {"format_version": FORMAT_VERSION, **meta}
    arrays[_META_KEY] = np.frombuffer(json.dumps(meta, sort_keys=True).encode("utf-8"), dtype=np.uint8)
    # written beside `path`, then renamed over it: a failed save never leaves half a checkpoint where a good one was
    path = os.path.realpath(path)  # through a symlink to its file (and the temporary file on that file system)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as fh:  # a file handle, so numpy does not append a second ".npz"
            np.savez(fh, **arrays)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_npz(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Reads a checkpoint written by ``save_npz``: ``(flat params, metadata)``.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "m.npz")
        >>> save_npz(p, {"w": np.ones(2)}, {"kind": "demo"})
        >>> load_npz(p)[0]["w"].tolist()
        [1.0, 1.0]
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            flat = {name: data[name] for name in data.files}
        meta = json.loads(flat.pop(_META_KEY).tobytes().decode("utf-8"))
        if not isinstance(meta, dict):
            raise ValueError("its metadata is not a JSON object")
    except (zipfile.BadZipFile, EOFError, zlib.error) as e:
        raise ValueError(f"{path}: not a cost-model checkpoint (a truncated or damaged .npz: {e})") from None
    except KeyError:
        raise ValueError(f"{path}: not a cost-model checkpoint (an .npz without felixjax metadata)") from None
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError) as e:
        # np.load(allow_pickle=False) of a file that is no .npz/.npy assumes pickle and refuses it
        why = ("it holds pickled object arrays, which are never loaded" if "Object arrays" in str(e) else
               "not an .npz file" if "pickle" in str(e) or isinstance(e, (TypeError, AttributeError)) else e)
        raise ValueError(f"{path}: not a cost-model checkpoint ({why})") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: unsupported checkpoint format {meta.get('format_version')!r} (this version reads "
                         f"format {FORMAT_VERSION})")
    return flat, meta
