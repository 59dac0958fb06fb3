"""Argument checks with messages that name the argument, its value and what is accepted.

Values that are not Python numbers (for example the arrays ``optax.inject_hyperparams``
passes in) are not checked: they are only known when the step runs.
"""

import numbers


def _is_number(value) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def positive_int(who: str, name: str, value, *, optional: bool = False, minimum: int = 1) -> None:
  """``value`` is an int >= ``minimum`` (or None when ``optional``)."""
  if value is None and optional:
    return
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    accepted = f"an int >= {minimum}" + (" or None" if optional else "")
    hint = ""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
      hint = (
        f" {name} fixes the shape of the program, so it cannot be an array; inside "
        f"optax.inject_hyperparams, list {name!r} in static_args."
      )
    raise ValueError(f"{who}: {name}={value!r} is not accepted; expected {accepted}.{hint}")


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
