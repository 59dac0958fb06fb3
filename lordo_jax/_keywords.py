"""Keyword options written once: each one's default, type and Args text in one place.

Options are the fields of frozen dataclasses (:func:`option`); :func:`takes` gives a
factory that reads them from ``**options`` its full keyword signature, so that
``inspect.signature``, ``help``, Sphinx and ``optax.inject_hyperparams`` see every
keyword and its default, and writes their Args entries where its docstring says
``{options}``.
"""

import dataclasses
import difflib
import functools
import inspect
import re
import textwrap
from typing import Any
from typing import NamedTuple

from lordo_jax import _checks as checks

# The integer options that fix the program's shapes or its rounds: Python values only,
# never injected by optax.inject_hyperparams (their defaults are None for that reason).
STATIC = (
  "rank",
  "sync_every",
  "refresh_every",
  "sync_moments_every",
  "first_moment_every",
  "second_moment_every",
  "subspace_iterations",
  "oversample",
  "power_iterations",
  "fragments",
  "seed",
)
_REQUIRED = inspect.Parameter.empty


class Keyword(NamedTuple):
  """One keyword option of the public factories."""

  name: str  # The keyword, as users write it.
  default: Any  # inspect.Parameter.empty where the keyword is required.
  annotation: Any
  doc: str  # Its Args text, without the name.
  field: str  # The dataclass field that holds it.


def option(doc: str, default: Any = _REQUIRED, *, keyword: str | None = None):
  """A dataclass field that is a keyword option: its ``doc`` and its public ``keyword``
  (``None``: the field's name)."""
  metadata = {"doc": doc, "keyword": keyword}
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
    keywords.append(Keyword(name, default, f.type, f.metadata["doc"], f.name))
  return tuple(k for k in keywords if not names or k.name in names)


def build(config: type, options: dict[str, Any]):
  """An instance of ``config`` from the keyword ``options`` that name its fields."""
  return config(**{k.field: options[k.name] for k in of(config) if k.name in options})


def takes(*groups: tuple[Keyword, ...], **defaults: Any):
  """Decorates a factory ``f(..., **options)``: its signature gains the keywords of
  ``groups`` (``defaults`` overrides theirs), keyword-only after its own.

  A call binds its arguments to that signature (an unknown keyword is a ``TypeError``
  naming the closest ones), checks that the :data:`STATIC` ones are Python values,
  and calls ``f`` with the group keywords, defaults applied, in ``options``. A
  keyword ``f`` declares itself keeps its place and default; its text still comes from
  the group. The docstring's ``{options}`` line becomes the Args entries of every group
  keyword in the signature.
  """
  keywords = {k.name: k for group in groups for k in group}
  unknown = set(defaults) - set(keywords)
  if unknown:
    raise TypeError(f"takes: defaults for keywords no group has: {sorted(unknown)}")

  def decorate(factory):
    own = inspect.signature(factory)
    parameters = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD]
    declared = {p.name for p in parameters}
    parameters += [
      inspect.Parameter(
        k.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=defaults.get(k.name, k.default),
        annotation=k.annotation,
      )
      for k in keywords.values()
      if k.name not in declared
    ]
    signature = own.replace(parameters=parameters)
    name = factory.__name__

    @functools.wraps(factory)
    def wrapper(*args, **kwargs):
      bound = _bound(name, signature, args, kwargs)
      checks.static_args(name, **{k: v for k, v in bound.items() if k in STATIC})
      return factory(**bound)

    wrapper.__signature__ = signature
    wrapper.__doc__ = _documented(
      factory.__doc__, [keywords[p.name] for p in parameters if p.name in keywords]
    )
    return wrapper

  return decorate


def like(model, *, without: tuple[str, ...]):
  """Decorates a factory ``f(..., **options)`` that passes ``options`` on to ``model``:
  its signature becomes ``model``'s without the keywords ``without``."""

  def decorate(factory):
    parameters = inspect.signature(model).parameters.values()
    kept = [p for p in parameters if p.name not in without]
    factory.__signature__ = inspect.signature(model).replace(parameters=kept)
    return factory

  return decorate


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
