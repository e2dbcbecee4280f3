"""How the plugin changes a fairseq function: the attribute that fairseq's own callers look up at
call time is replaced, once, by a wrapper around the original, after checking that those callers
still look it up there.

If a fairseq release calls the function another way, importing the plugin fails with a message
saying which change no longer applies, instead of the change silently doing nothing. Used by
``model_support`` (what the model needs) and ``fixes`` (fairseq's defects, fixed for
every model).
"""

from types import FunctionType, ModuleType
from typing import Callable, Sequence, Union

# The plugin's changes a replacement holds (the names of their wrap functions): its own and those
# of the replacements it wraps, so that two changes of one function both install, and a second
# import of the plugin installs neither again.
MARKER = "__patched_by_realformer__"


def patch(
    owner: Union[ModuleType, type],
    name: str,
    wrap: Callable[[Callable], Callable],
    call_sites: Sequence[FunctionType] = (),
):
    """Replace ``owner.name`` by ``wrap(owner.name)``, once. Each function of *call_sites* must
    look ``name`` up on *owner* when it runs (``owner_alias.name(...)``; ``name(...)`` inside
    *owner* itself; ``from package import owner`` inside the function; or, for a class's
    ``__init__``, calling the class), or the replacement would never be called there: that
    raises ImportError."""
    original = getattr(owner, name, None)
    if original is None:
        raise ImportError(
            f"fairseq_realformer: {owner.__name__}.{name} no longer exists in this fairseq; "
            f"the plugin's patch of it cannot be installed"
        )
    for site in call_sites:
        _check_call_site(owner, name, site)
    change = f"{wrap.__module__}.{wrap.__qualname__}"
    installed = getattr(original, MARKER, frozenset())
    if change in installed:
        return
    replacement = wrap(original)
    setattr(replacement, MARKER, installed | {change})
    setattr(owner, name, replacement)


def installed(function: Callable) -> frozenset:
    """The plugin's changes that *function* (a fairseq attribute as it is now) holds."""
    return getattr(function, MARKER, frozenset())


def _check_call_site(owner: Union[ModuleType, type], name: str, site: FunctionType) -> None:
    site = getattr(site, "__wrapped__", site)
    code, short_name = site.__code__, owner.__name__.rpartition(".")[2]
    looked_up_on_owner = (
        site.__globals__ is vars(owner)
        or any(v is owner for v in site.__globals__.values())
        or short_name in code.co_varnames
        and short_name in code.co_names
    )
    called = short_name if isinstance(owner, type) and name == "__init__" else name
    if not (looked_up_on_owner and called in code.co_names):
        raise ImportError(
            f"fairseq_realformer: {site.__module__}.{site.__qualname__} no longer calls "
            f"{owner.__name__}.{name}; the plugin's patch of it would never run there"
        )
