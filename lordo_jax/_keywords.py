"""Keyword options written once: each one's default, type and Args text in one place.

Options are the fields of frozen dataclasses (:func:`option`). A public factory declares
each of its keywords in its ``def``, the default written as a literal (``b1: float =
0.9``), the same as the field's, or as the factory's own where the field records one
(lordo's ``omega=0.7``, ``option(..., defaults={"lordo": 0.7})``); one test keeps the
``def`` s, the fields and the API pages in agreement. :func:`takes` checks at import that
the ``def`` declares every option of its groups, checks a call's static values once, at
the public entry, and writes the options' Args entries where the docstring says
``{options}``.
"""

import dataclasses
import difflib
import functools
import inspect
import re
import textwrap
from collections.abc import Callable
from typing import Any
from typing import NamedTuple
from typing import TypeVar

from lordo_jax import _checks as checks

# The integers that fix the program's shapes or its rounds and that factories declare
# themselves, outside any option group (a group's are ``option(..., static=True)``):
# Python values only, never injected by optax.inject_hyperparams (their defaults are
# None for that reason).
STATIC = (
  "refresh_every",
  "sync_moments_every",
  "first_moment_every",
  "second_moment_every",
  "seed",
)
_REQUIRED = inspect.Parameter.empty
F = TypeVar("F", bound=Callable[..., Any])


class Keyword(NamedTuple):
  """One keyword option of the public factories."""

  name: str  # The keyword, as users write it.
  default: Any  # inspect.Parameter.empty where the keyword is required.
  annotation: Any
  doc: str  # Its Args text, without the name.
  field: str  # The dataclass field that holds it.
  static: bool  # It fixes the program's shapes or rounds: a Python value, never an array.
  defaults: dict[str, Any]  # A factory's own default where not ``default``, by its name.

  def default_of(self, factory: str) -> Any:
    """The default of this keyword in the public factory named ``factory``."""
    return self.defaults.get(factory, self.default)


def option(
  doc: str,
  default: Any = _REQUIRED,
  *,
  keyword: str | None = None,
  static: bool = False,
  defaults: dict[str, Any] | None = None,
):
  """A dataclass field that is a keyword option: its ``doc``, its public ``keyword``
  (``None``: the field's name), whether it is ``static`` (fixes the program's shapes
  or rounds, so must be a Python value) and the ``defaults`` of the public factories
  whose own default it is not (by the factory's name: ``{"lordo": 0.7}``)."""
  metadata = {"doc": doc, "keyword": keyword, "static": static, "defaults": defaults or {}}
  if default is _REQUIRED:
    return dataclasses.field(metadata=metadata)
  return dataclasses.field(default=default, metadata=metadata)


def of(config: type, *names: str) -> tuple[Keyword, ...]:
  """The :class:`Keyword` s of the dataclass ``config``'s fields (only ``names``, by
  keyword, when given), in field order."""
  keywords = []
  for f in dataclasses.fields(config):
    name = f.metadata["keyword"] or f.name
    default = _REQUIRED if f.default is dataclasses.MISSING else f.default
    static = f.metadata["static"]
    doc, defaults = f.metadata["doc"], f.metadata["defaults"]
    keywords.append(Keyword(name, default, f.type, doc, f.name, static, defaults))
  return tuple(k for k in keywords if not names or k.name in names)


def build(config: type, options: dict[str, Any]):
  """An instance of ``config`` from the keyword ``options`` that name its fields."""
  return config(**{k.field: options[k.name] for k in of(config) if k.name in options})


def takes(*groups: tuple[Keyword, ...]) -> Callable[[F], F]:
  """Decorates a factory whose ``def`` declares every keyword of ``groups``.

  The ``def`` is the signature users, editors and type checkers read, each default a
  literal. When the module loads, every keyword of ``groups`` must be a parameter of
  the ``def``: a keyword added to a group fails the import of every factory that does
  not declare it. A call binds its arguments (an unknown keyword is a ``TypeError``
  naming the closest ones) and checks, once, that the static ones are Python values (one
  error names them all); the factory checks the values themselves. The docstring's
  ``{options}`` line becomes the Args entries of the group keywords it does not
  document itself.
  """
  keywords = {k.name: k for group in groups for k in group}
  static = {k.name for k in keywords.values() if k.static} | set(STATIC)

  def decorate(factory: F) -> F:
    signature = inspect.signature(factory)
    name = factory.__name__
    _check_declared(name, signature, keywords)

    @functools.wraps(factory)
    def wrapper(*args, **kwargs):
      bound = _bound(name, signature, args, kwargs)
      checks.static_args(name, **{k: v for k, v in bound.items() if k in static})
      return factory(**bound)

    wrapper.__doc__ = _documented(
      factory.__doc__, [keywords[p] for p in signature.parameters if p in keywords]
    )
    return wrapper

  return decorate


def given(arguments: dict[str, Any], *groups: tuple[Keyword, ...]) -> dict[str, Any]:
  """The keywords of ``groups`` among a factory's ``arguments`` (its ``locals()`` on
  entry), by name."""
  return {k.name: arguments[k.name] for group in groups for k in group}


def without(group: tuple[Keyword, ...], *names: str) -> tuple[Keyword, ...]:
  """``group`` less the keywords ``names``."""
  return tuple(k for k in group if k.name not in names)


def _check_declared(name, signature, keywords) -> None:
  """An error, at import, for a group keyword the ``def`` lacks."""
  for k in keywords.values():
    p = signature.parameters.get(k.name)
    if p is None or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
      raise TypeError(f"{name}: the keyword {k.name!r} of its options is not in its def.")


def _bound(name: str, signature: inspect.Signature, args, kwargs) -> dict[str, Any]:
  """The call's arguments by name, defaults applied; a clear error for an unknown one."""
  for keyword in kwargs:
    if keyword not in signature.parameters:
      close = difflib.get_close_matches(keyword, list(signature.parameters), n=3)
      hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
      raise TypeError(f"{name}() got an unexpected keyword argument {keyword!r}.{hint}")
  try:
    bound = signature.bind(*args, **kwargs)
  except TypeError as error:
    raise TypeError(f"{name}(): {error}") from None
  bound.apply_defaults()
  return dict(bound.arguments)


def _documented(doc: str, keywords: list[Keyword]) -> str:
  """``doc`` with its ``{options}`` line replaced by the Args entries of the keywords
  it does not document itself (a method may say more of its ``sync_every``)."""
  lines = doc.splitlines()
  (at,) = [i for i, line in enumerate(lines) if line.strip() == "{options}"]
  indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
  entry = re.compile(rf"{indent}(\w+):")
  documented = {m.group(1) for line in lines if (m := entry.match(line))}
  keywords = [k for k in keywords if k.name not in documented]
  entries = [
    textwrap.fill(
      f"{k.name}: {k.doc}",
      width=88,
      initial_indent=indent,
      subsequent_indent=indent + "  ",
      break_on_hyphens=False,
      break_long_words=False,
    )
    for k in keywords
  ]
  return "\n".join([*lines[:at], *entries, *lines[at + 1 :]])
