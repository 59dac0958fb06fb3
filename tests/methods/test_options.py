"""Every public factory refuses a typo in any string option and an out-of-range number,
and declares each default as its option and the API pages do.

The options are found from the signatures, so a new option is covered the day it is
added: a string default (or ``compression``) gets a typo, a number with a range gets
a value outside it. Each error must name the option.
"""

import ast
import dataclasses
import inspect
import pathlib
import re

import jedi
import optax
import pytest

import lordo_jax
from lordo_jax import _keywords as keywords
from lordo_jax.local import _low_rank_options as low_rank_options
from lordo_jax.local import bases
from lordo_jax.methods import data_parallel
from lordo_jax.methods import options as options_lib
from lordo_jax.round import _round_options as round_options

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
# String options whose default is None.
STRING_OPTIONS_WITHOUT_A_STRING_DEFAULT = ("compression", "init_projection")
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


# Every option group: a dataclass whose fields are keyword options (lordo_jax._keywords).
GROUPS = (
  options_lib.Schedule,
  options_lib.LocalOptions,
  low_rank_options.LowRankOptions,
  round_options.RoundBasics,
  round_options.RoundOptions,
)
OPTIONS = {k.name: k for group in GROUPS for k in keywords.of(group)}
# What a None default of a static integer means (None so that optax.inject_hyperparams
# leaves it alone), where the docstrings say "``None``: N".
MEANING_OF_NONE = {
  name: bases.Options._field_defaults[name]
  for name in ("subspace_iterations", "oversample", "power_iterations")
} | {"refresh_every": data_parallel.DEFAULT_REFRESH_EVERY}
API_PAGES = sorted((pathlib.Path(lordo_jax.__file__).parents[1] / "docs" / "api").glob("*.md"))
# A signature an API page writes as a cross-reference: {func}`name(args) <lordo_jax.name>`.
SIGNATURE = re.compile(r"\{func\}`(\w+)\(([^()`]*)\) <lordo_jax\.\1>`")


def _documented_defaults() -> list[tuple[str, str, object]]:
  """``(factory, keyword, default)`` for every ``keyword=literal`` of a signature on the
  API pages (``rank=r`` in an example call is no literal, and no default)."""
  found = []
  for page in API_PAGES:
    for factory, arguments in SIGNATURE.findall(page.read_text(encoding="utf-8")):
      for argument in arguments.split(", "):
        keyword, _, value = argument.partition("=")
        try:
          found.append((factory, keyword, ast.literal_eval(value)))
        except (ValueError, SyntaxError):  # No default, or not a literal.
          continue
  return found


def test_each_default_is_the_same_in_the_def_its_option_and_the_api_pages():
  """One default per keyword: the public ``def``'s literal is its option's (the field's,
  or the factory's own the field records), the API pages' signatures write it, and a
  static integer's ``None`` means, in its Args text, what the code takes for it."""
  disagreements = []
  for factory in sorted(REQUIRED):
    function = getattr(lordo_jax, factory)
    parameters = inspect.signature(function).parameters
    doc = inspect.getdoc(function)
    takes_options = hasattr(function, "__wrapped__")  # Declared by keywords.takes.
    for name, parameter in parameters.items():
      option = OPTIONS.get(name) if takes_options else None
      if option is not None and parameter.default != option.default_of(factory):
        disagreements.append(
          f"{factory}({name}={parameter.default!r}): its option says {option.default_of(factory)!r}"
        )
      said = re.search(rf"\n  {name}: [^\n]*(?:\n   [^\n]*)*", doc)
      none_means = said and re.search(r"``None``: (\d+)\b", said[0])
      if parameter.default is None and none_means and name in MEANING_OF_NONE:
        if int(none_means[1]) != MEANING_OF_NONE[name]:
          disagreements.append(f"{factory}: its Args say {name}=None is {none_means[1]}")
  for option in OPTIONS.values():  # A factory's own default is of a factory that takes it.
    for factory in option.defaults:
      if option.name not in inspect.signature(getattr(lordo_jax, factory)).parameters:
        disagreements.append(f"{option.name}: a default for {factory}, which lacks it")
  documented = _documented_defaults()
  assert {"lordo", "diloco", "desloc"} <= {factory for factory, _, _ in documented}
  for factory, name, default in documented:
    declared = inspect.signature(getattr(lordo_jax, factory)).parameters[name].default
    if declared != default or type(declared) is not type(default):
      disagreements.append(f"API pages: {factory}({name}={default!r}), its def {declared!r}")
  assert not disagreements, "\n".join(disagreements)


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


def test_a_def_that_misses_an_option_fails_when_it_is_defined():
  """Adding an option to a group fails the import of every factory that does not
  declare it."""
  group = _group(b1=(float, 0.9), side=(str, "auto"))

  with pytest.raises(TypeError, match="keyword 'side' of its options is not in its def"):

    @keywords.takes(group)
    def missing(*, b1: float = 0.9):
      """{options}"""

  @keywords.takes(group)
  def declared(*, b1: float = 0.5, side: str = "auto"):
    """Args:
    {options}
    """
    return b1, side

  assert declared() == (0.5, "auto")
  assert "b1: the option b1." in declared.__doc__
