"""The console's pre-sessions (the tokens of the forms before sign-in), on a clock the test
moves: what is accepted, for how long, and how many are kept."""

from __future__ import annotations

from pgplane.console.presession import Issued, PreSessions

S = 1_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_000 * S

    def __call__(self) -> int:
        return self.now


def test_a_token_is_accepted_for_its_own_pre_session_only() -> None:
    forms = PreSessions(clock=Clock())
    one, two = forms.issue(""), forms.issue("")
    assert one.fresh and two.fresh and one.id != one.token
    assert forms.accepts(one.id, one.token) and forms.accepts(two.id, two.token)
    assert not forms.accepts(one.id, two.token)
    assert not forms.accepts(two.id, one.token)
    assert not forms.accepts(one.id, "")
    assert not forms.accepts("never-issued", "never-issued")
    assert not forms.accepts("", "")


def test_a_browser_keeps_its_pre_session_and_a_cookie_the_server_never_set_gets_a_new_one() -> None:
    forms = PreSessions(clock=Clock())
    first = forms.issue("")
    again = forms.issue(first.id)  # another tab, or the form shown again after a wrong password
    assert again == Issued(id=first.id, token=first.token, fresh=False)
    planted = forms.issue("chosen-by-the-attacker")
    assert planted.fresh and planted.id != "chosen-by-the-attacker"
    assert not forms.accepts("chosen-by-the-attacker", planted.token)
    assert forms.issue("x" * 200).fresh


def test_a_pre_session_lives_an_hour_after_the_page_last_showed_it() -> None:
    clock = Clock()
    forms = PreSessions(lifetime_seconds=3600, clock=clock)
    kept, left = forms.issue(""), forms.issue("")
    clock.now += 3000 * S
    assert forms.issue(kept.id).id == kept.id  # shown again: another hour
    clock.now += 1000 * S
    assert forms.accepts(kept.id, kept.token)
    assert not forms.accepts(left.id, left.token)
    assert forms.issue(left.id).fresh
    assert len(forms) == 2  # the expired one is gone, not just refused


def test_a_flood_of_pages_keeps_memory_bounded_and_forgets_the_oldest() -> None:
    forms = PreSessions(capacity=100, clock=Clock())
    oldest = forms.issue("")
    for _ in range(1_000):
        forms.issue("")
    assert len(forms) == 100
    assert not forms.accepts(oldest.id, oldest.token)


def test_signing_in_spends_the_pre_session() -> None:
    forms = PreSessions(clock=Clock())
    issued = forms.issue("")
    forms.end(issued.id)
    assert not forms.accepts(issued.id, issued.token)
    forms.end("never-issued")  # nothing to end is no error
