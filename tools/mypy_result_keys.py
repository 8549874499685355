"""A mypy plugin: ``.get("key")`` on one of the analysis result's TypedDicts
(``recoverydash.recovery.result``) with a key the type does not have is an error.

mypy checks ``result["key"]`` against a TypedDict, but lets ``result.get("key")`` of an unknown
key pass (typed ``object``; PEP 589 allows ``.get`` of any str). Readers of a stored result use
``.get`` (a result stored by an older version may lack a key), so without this a misspelled or
renamed key there would go unnoticed. Registered in pyproject.toml (``[tool.mypy] plugins``);
the error is mypy's own for ``[]`` (code ``typeddict-item``). Then mypy's default ``.get``
typing runs as before.
"""
from __future__ import annotations

from collections.abc import Callable

from mypy.plugin import MethodContext, Plugin
from mypy.plugins.default import typed_dict_get_callback
from mypy.typeops import try_getting_str_literals
from mypy.types import Type, TypedDictType, get_proper_type

#: The module whose TypedDicts are checked.
CHECKED = "recoverydash.recovery.result."


def _get_with_known_key(ctx: MethodContext) -> Type:
    """Report each literal key of the call that the TypedDict lacks, then type it as mypy does."""
    typ = get_proper_type(ctx.type)
    if (isinstance(typ, TypedDictType) and typ.fallback.type.fullname.startswith(CHECKED)
            and ctx.args and len(ctx.args[0]) == 1):
        for key in try_getting_str_literals(ctx.args[0][0], ctx.arg_types[0][0]) or []:
            if key not in typ.items:
                ctx.api.msg.typeddict_key_not_found(typ, key, ctx.context)
    return typed_dict_get_callback(ctx)


class ResultKeysPlugin(Plugin):
    def get_method_hook(self, fullname: str) -> Callable[[MethodContext], Type] | None:
        return _get_with_known_key if fullname == "typing.Mapping.get" else None


def plugin(version: str) -> type[Plugin]:
    """mypy's entry point."""
    return ResultKeysPlugin
