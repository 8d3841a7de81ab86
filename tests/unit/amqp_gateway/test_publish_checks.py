"""routing.check_properties: RabbitMQ's checks of every publish's user-id and expiration
(rabbit_channel:check_user_id_header/2, check_expiration_header/1), in its words."""

from __future__ import annotations

import pytest

from amqp_gateway import codec, errors, routing


@pytest.mark.parametrize(
    ("expiration", "problem"),
    [
        ("0", None),
        ("60000", None),
        ("+5", None),  # string:to_integer/1 takes a sign
        ("007", None),
        ("4294967296", None),
        ("315360000000", None),  # ten years, rabbit_misc:check_expiry/1's bound
        ("315360000001", "{value_too_large,315360000001}"),
        # ~p breaks a term that would end past column 78 (checked against erl).
        ("9" * 20, "{value_too_large,\n" + " " * 44 + "9" * 20 + "}"),
        ("1\n" + "x" * 40, "{leftover_string,\n" + " " * 44 + '"\\n' + "x" * 40 + '"}'),
        ("1" + "x" * 60, "{leftover_string,\n" + " " * 85 + '"' + "x" * 60 + '"}'),
        ("-1", "{value_negative,-1}"),
        ("-0", None),
        ("abc", "no_integer"),
        ("", "no_integer"),
        (" 5", "no_integer"),
        ("-", "no_integer"),
        ("1.5", '{leftover_string,".5"}'),
        ("5 ", '{leftover_string," "}'),
        ('5"\\', '{leftover_string,"\\"\\\\"}'),
        ("5\x01", "{leftover_string,[1]}"),
        ("5\xe9", '{leftover_string,"\xe9"}'),  # Latin-1 printable bytes stay as they are
    ],
)
def test_expiration_problem_is_what_rabbitmq_prints(expiration: str, problem: str | None) -> None:
    assert routing.expiration_problem(expiration) == problem


def raw(**fields: object) -> bytes:
    return codec.encode_properties(codec.BasicProperties(**fields))  # type: ignore[arg-type]


def test_needs_check_reads_only_the_flag_bits() -> None:
    assert not routing.needs_check(b"")
    assert not routing.needs_check(raw(content_type="x", headers={"user_id": "bob"}))
    assert routing.needs_check(raw(user_id="guest"))
    assert routing.needs_check(raw(expiration="1"))


def test_a_user_id_must_be_the_connections_user_unless_it_impersonates() -> None:
    routing.check_properties(raw(user_id="guest"), "guest", False)
    routing.check_properties(raw(user_id="bob"), "guest", True)
    with pytest.raises(errors.PreconditionFailed) as refused:
        routing.check_properties(raw(user_id="bob"), "guest", False)
    assert refused.value.reply_text == (
        "user_id property set to 'bob' but authenticated user was 'guest'"
    )
    assert (refused.value.class_id, refused.value.method_id) == (60, 40)


def test_the_user_id_is_checked_before_the_expiration() -> None:
    with pytest.raises(errors.PreconditionFailed, match="user_id property") as refused:
        routing.check_properties(raw(user_id="bob", expiration="x"), "guest", False)
    assert "expiration" not in refused.value.reply_text
    with pytest.raises(errors.PreconditionFailed) as refused:
        routing.check_properties(raw(expiration="x"), "guest", False)
    assert refused.value.reply_text == "invalid expiration 'x': no_integer"
