"""Every public factory refuses a typo in any string option and an out-of-range number.

The options are found from the signatures, so a new option is covered the day it is
added: a string default (or ``compression``) gets a typo, a number with a range gets
a value outside it. Each error must name the option.
"""

import inspect

import optax
import pytest

import lordo_jax

# The arguments each public factory needs; every factory of the API is here.
REQUIRED = {
  "lordo": dict(learning_rate=1e-2, rank=2, sync_every=2),
  "lordo_local_projection": dict(learning_rate=1e-2, rank=2, sync_every=2),
  "lordo_global_projection_only": dict(learning_rate=1e-2, rank=2, sync_every=2),
  "low_rank_ddp": dict(learning_rate=1e-2, rank=2),
  "ddp": dict(learning_rate=1e-2),
  "diloco": dict(learning_rate=1e-2, sync_every=2),
  "local_adam": dict(learning_rate=1e-2, sync_every=2),
  "desloc": dict(learning_rate=1e-2, sync_every=2),
  "average_gradients": dict(axis_name=None),
  "scale_by_low_rank_adam": dict(rank=2),
  "synchronize": dict(inner=optax.adam(1e-2), sync_every=2),
  "in_float32": dict(inner=optax.adam(1e-2)),  # no option of its own
}
# None for a method's own choice (LoRDO's projection: one-sided or two-sided).
STRING_OPTIONS_WITHOUT_A_STRING_DEFAULT = ("compression", "init_projection", "projection")
NOT_AN_OPTION = ("name",)  # synchronize's name for its errors: any string.
OUT_OF_RANGE = {
  "omega": 1.5,
  "mu": 0.0,
  "b1": 1.0,
  "b2": -0.1,
  "eps": -1e-8,
  "weight_decay": -0.1,
  "qh_nu": 2.0,
  "full_rank_nu": -0.5,
  "outer_momentum": 1.0,
  "outer_learning_rate": 0.0,
}


def test_every_public_factory_is_listed():
  factories = set()
  for name in lordo_jax.__all__:
    value = getattr(lordo_jax, name)
    returns = inspect.signature(value).return_annotation if inspect.isfunction(value) else None
    if "Transformation" in str(returns) or name == "scale_by_low_rank_adam":
      factories.add(name)
  assert factories == set(REQUIRED)


def _string_options():
  for factory, required in REQUIRED.items():
    for name, parameter in inspect.signature(getattr(lordo_jax, factory)).parameters.items():
      if name in NOT_AN_OPTION or name in required:
        continue
      if isinstance(parameter.default, str) or name in STRING_OPTIONS_WITHOUT_A_STRING_DEFAULT:
        yield factory, name


def _numeric_options():
  for factory, required in REQUIRED.items():
    for name in inspect.signature(getattr(lordo_jax, factory)).parameters:
      if name in OUT_OF_RANGE and name not in required:
        yield factory, name


@pytest.mark.parametrize("factory, option", list(_string_options()))
def test_a_typo_in_a_string_option_is_refused_by_name(factory, option):
  with pytest.raises(ValueError, match=rf"{option}='typo' is not accepted"):
    getattr(lordo_jax, factory)(**REQUIRED[factory], **{option: "typo"})


@pytest.mark.parametrize("factory, option", list(_numeric_options()))
def test_an_out_of_range_number_is_refused_by_name(factory, option):
  bad = OUT_OF_RANGE[option]
  with pytest.raises(ValueError, match=rf"{option}={bad!r} is not accepted"):
    getattr(lordo_jax, factory)(**REQUIRED[factory], **{option: bad})


def test_the_enumeration_covers_the_string_options_users_mistype():
  found = set(_string_options())
  for pair in [
    ("scale_by_low_rank_adam", "transport"),
    ("scale_by_low_rank_adam", "init_projection"),
    ("lordo", "projection"),
    ("low_rank_ddp", "communicate"),
    ("synchronize", "projection_source"),
    ("diloco", "compression"),
  ]:
    assert pair in found, pair
  assert ("scale_by_low_rank_adam", "omega") in set(_numeric_options())


@pytest.mark.parametrize("factory", sorted(REQUIRED))
def test_every_keyword_of_the_signature_has_its_args_entry(factory):
  """The shared keywords' Args text is written once and lands in every docstring."""
  function = getattr(lordo_jax, factory)
  doc = inspect.getdoc(function)
  args = doc[doc.index("Args:") : doc.index("Returns:")]
  if "any other keyword argument of :func:`lordo`" in args:
    args += inspect.getdoc(lordo_jax.lordo)
  for name in inspect.signature(function).parameters:
    assert f"\n  {name}:" in args or f", {name}" in args or f"{name}, " in args, name
  assert "{options}" not in doc


def test_an_unknown_keyword_is_a_type_error_naming_the_closest():
  with pytest.raises(
    TypeError,
    match=r"lordo\(\) got an unexpected keyword argument "
    r"'omgea'\. Did you mean 'omega'( or '\w+')*\?",
  ):
    lordo_jax.lordo(1e-2, rank=2, sync_every=2, omgea=0.5)
  with pytest.raises(TypeError, match=r"ddp\(\): too many positional arguments"):
    lordo_jax.ddp(1e-2, "axis")


@pytest.mark.parametrize(
  "factory", ["lordo", "lordo_local_projection", "low_rank_ddp", "scale_by_low_rank_adam"]
)
def test_the_low_rank_step_takes_the_same_keywords_with_the_same_text(factory):
  """One list of the step's options: every low-rank factory has them all, the same."""
  step = inspect.signature(lordo_jax.scale_by_low_rank_adam).parameters
  own = inspect.signature(getattr(lordo_jax, factory)).parameters
  shared = [k.name for k in lordo_jax.local._low_rank_adam.STEP_KEYWORDS]
  assert set(shared) <= set(own) and set(shared) <= set(step)
  overridden = {
    "lordo": {"omega", "projection"},
    "lordo_local_projection": {"omega", "projection"},
    "low_rank_ddp": {"transport"},
  }.get(factory, set())
  for name in set(shared) - overridden - {"rank"}:
    assert own[name].default == step[name].default, name
