"""Every public factory refuses a typo in any string option and an out-of-range number.

The options are found from the signatures, so a new option is covered the day it is
added: a string default (or ``compression``) gets a typo, a number with a range gets
a value outside it. Each error must name the option.
"""

import dataclasses
import inspect
import pathlib

import jedi
import optax
import pytest

import lordo_jax
from lordo_jax import _keywords as keywords

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
  with pytest.raises(TypeError, match=r"unexpected keyword argument 'omega'"):
    lordo_jax.lordo_global_projection_only(1e-2, rank=2, sync_every=2, omega=0.5)
  with pytest.raises(TypeError, match=r"ddp\(\): too many positional arguments"):
    lordo_jax.ddp(1e-2, "axis")


@pytest.mark.parametrize(
  "factory", ["lordo", "lordo_local_projection", "low_rank_ddp", "scale_by_low_rank_adam"]
)
def test_the_low_rank_step_takes_the_same_keywords_with_the_same_text(factory):
  """One list of the step's options: every low-rank factory has them all, the same."""
  step = inspect.signature(lordo_jax.scale_by_low_rank_adam).parameters
  own = inspect.signature(getattr(lordo_jax, factory)).parameters
  shared = [k.name for k in lordo_jax.local._low_rank_options.STEP_KEYWORDS]
  assert set(shared) <= set(own) and set(shared) <= set(step)
  overridden = {
    "lordo": {"omega", "projection"},
    "lordo_local_projection": {"omega", "projection"},
    "low_rank_ddp": {"transport"},
  }.get(factory, set())
  for name in set(shared) - overridden - {"rank"}:
    assert own[name].default == step[name].default, name


@pytest.fixture(scope="module")
def jedi_project():
  return jedi.Project(str(pathlib.Path(lordo_jax.__file__).parents[1]))


@pytest.mark.parametrize("factory", sorted(REQUIRED))
def test_a_static_checker_sees_every_keyword_in_the_def(factory, jedi_project):
  """jedi, the analyser behind editors' completion and go-to-definition, reads the
  source, not ``__signature__``: it sees a keyword only where the ``def`` declares it
  (the wrapper of a ``**options`` def showed it ``*args, **kwargs``)."""
  call = f"lordo_jax.{factory}("
  script = jedi.Script("import lordo_jax\n" + call, project=jedi_project)
  (signature,) = script.get_signatures(2, len(call))
  static = [p.name for p in signature.params]
  assert static == list(inspect.signature(getattr(lordo_jax, factory)).parameters)


def _group(**fields):
  """A keyword group of ``fields`` (name -> (annotation, default))."""
  config = dataclasses.make_dataclass(
    "Group",
    [(n, a, keywords.option(f"the option {n}.", d)) for n, (a, d) in fields.items()],
    frozen=True,
  )
  return keywords.of(config)


def test_a_def_that_misses_or_changes_an_option_fails_when_it_is_defined():
  """Adding an option to a group fails the import of every factory that does not
  declare it, and a default written anew must match the group's (or be an override)."""
  group = _group(b1=(float, 0.9), side=(str, "auto"))

  with pytest.raises(TypeError, match="keyword 'side' of its options is not in its def"):

    @keywords.takes(group)
    def missing(*, b1: float = 0.9):
      """{options}"""

  with pytest.raises(TypeError, match=r"b1: <class 'float'> = 0.5 in its def.*= 0.9"):

    @keywords.takes(group)
    def changed(*, b1: float = 0.5, side: str = "auto"):
      """{options}"""

  @keywords.takes(group, overrides=("b1",))
  def overridden(*, b1: float = 0.5, side: str = "auto"):
    """Args:
    {options}
    """
    return b1, side

  assert overridden() == (0.5, "auto")
  assert "b1: the option b1." in overridden.__doc__
