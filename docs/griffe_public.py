"""A griffe extension for the API page: a public function wins over a module of its name.

``shardio.pack``, ``merge``, ``unpack``, ``verify``, ``preview`` and ``doctor`` are
functions that share their names with modules; at run time ``shardio/__init__.py`` keeps
the functions, while griffe's tree would give ``::: shardio.pack`` the module. For each
such name of ``__all__``, the package's member becomes an alias of the function, so the
API page documents what ``shardio.pack`` is to a user. Names without a clash are untouched.
"""

from __future__ import annotations

from typing import Any

import griffe


class PublicNames(griffe.Extension):
    """Point ``shardio.<name>`` at the function of that name where a module shares it."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader,
                   **kwargs: Any) -> None:
        for export in pkg.exports or ():
            name = str(export)  # an entry of __all__ may be parsed as an expression
            member = pkg.members.get(name)
            if isinstance(member, griffe.Module) and name in member.members:
                pkg.set_member(name, griffe.Alias(name, member.members[name], parent=pkg))
