"""Argument checks with messages that name the argument, its value and what is accepted.

Values that are not Python numbers (for example the arrays ``optax.inject_hyperparams``
passes in) are not checked: they are only known when the step runs. Arguments that
fix the program (ranks, periods, counts) must be Python values: :func:`static_args`
names every one that arrived as an array, in one error.
"""

import numbers
import os
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.abspath(__file__))
# Libraries through which an optimizer is called: a warning skips their frames too.
_CALLING_LIBRARIES = ("optax", "jax", "jaxlib", "flax")


def _is_number(value) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_array(value) -> bool:
  return hasattr(value, "shape") and hasattr(value, "dtype")


def static_args(who: str, **values) -> None:
  """Every one of ``values`` is a Python value, not an array: one error names the others.

  ``optax.inject_hyperparams`` turns every numeric argument it is given, and every
  callable (as a schedule), into an array; the integers that fix the program's shapes
  and its rounds must be listed in its ``static_args``.
  """
  arrays = [name for name, value in values.items() if _is_array(value)]
  if arrays:
    listed = ", ".join(f"{name}={values[name]!r}" for name in arrays)
    are, they = ("is an array", "it fixes") if len(arrays) == 1 else ("are arrays", "they fix")
    raise ValueError(
      f"{who}: {listed} {are}; {they} the shape of the program or when it "
      "communicates, so must be a Python value. Inside optax.inject_hyperparams, "
      f"pass static_args={tuple(arrays)!r}."
    )


def positive_int(who: str, name: str, value, *, optional: bool = False, minimum: int = 1) -> None:
  """``value`` is an int >= ``minimum`` (or None when ``optional``)."""
  if value is None and optional:
    return
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    accepted = f"an int >= {minimum}" + (" or None" if optional else "")
    static_args(who, **{name: value})
    raise ValueError(f"{who}: {name}={value!r} is not accepted; expected {accepted}.")


def in_interval(who: str, name: str, value, low: float, high: float, *, closed_high: bool):
  """``low <= value <= high`` (or ``< high``), when ``value`` is a Python number."""
  if not _is_number(value):
    return
  inside = low <= value <= high if closed_high else low <= value < high
  if not inside:
    bracket = "]" if closed_high else ")"
    raise ValueError(
      f"{who}: {name}={value!r} is not accepted; expected a number in [{low}, {high}{bracket}."
    )


def positive(who: str, name: str, value) -> None:
  """``value > 0``, when ``value`` is a Python number."""
  if _is_number(value) and not value > 0:
    raise ValueError(f"{who}: {name}={value!r} is not accepted; expected a number > 0.")


def non_negative(who: str, name: str, value) -> None:
  """``value >= 0``, when ``value`` is a Python number."""
  if _is_number(value) and not value >= 0:
    raise ValueError(f"{who}: {name}={value!r} is not accepted; expected a number >= 0.")


def one_of(who: str, name: str, value, accepted: tuple) -> None:
  """``value`` is one of ``accepted``."""
  if value not in accepted:
    choices = ", ".join(repr(a) for a in accepted)
    raise ValueError(f"{who}: {name}={value!r} is not accepted; expected one of {choices}.")


def static_phase(who: str, name: str, phase, phases: tuple, maker: str) -> None:
  """``phase`` (of ``update(..., name=phase)``) is one of ``phases`` as a static value,
  the kind ``maker`` computes on the host."""
  if _is_array(phase) or phase not in phases:
    expected = " or ".join(repr(p) for p in phases)
    raise ValueError(
      f"{who}: {name}={phase!r} is not a phase; expected a static {expected} from {maker}."
    )


def warn(message: str) -> None:
  """A ``UserWarning`` attributed to the user's line: the first caller outside this
  package and the libraries that call an optimizer (optax, JAX, Flax), so that a
  warning raised inside ``tx.init`` points at the ``init`` or ``nnx.Optimizer`` call."""
  skipped = (_PACKAGE + os.sep,) + tuple(
    os.path.dirname(os.path.abspath(module.__file__)) + os.sep
    for module in map(sys.modules.get, _CALLING_LIBRARIES)
    if getattr(module, "__file__", None)
  )
  level, frame = 2, sys._getframe(1)
  while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(skipped):
    level, frame = level + 1, frame.f_back
  warnings.warn(message, UserWarning, stacklevel=level)
