"""One raw row -> one Prompt or one RejectedRow: every format, every normalisation, every reason."""

from __future__ import annotations

import pytest

from core.records import Message, Prompt, Turns
from intake.limits import MAX_CONTENT_PARTS, MAX_TURNS
from intake.rejected import RejectedRow
from intake.row_fields import RowFields
from intake.rows import parse_row

ROW = 7


def prompt_of(raw: object) -> Prompt:
    result = parse_row(raw, row=ROW)
    assert isinstance(result, Prompt), result
    return result


def reason_of(raw: object) -> str:
    result = parse_row(raw, row=ROW)
    assert isinstance(result, RejectedRow), result
    assert result.row == ROW
    return result.reason


def user(text: str) -> dict[str, object]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, object]:
    return {"role": "assistant", "content": text}


# --- accepted formats ---------------------------------------------------------------------


def test_an_openai_messages_row_becomes_a_prompt_with_its_row_number() -> None:
    prompt = prompt_of({"id": "a1", "messages": [user("Why is the sky blue?")]})
    assert prompt == Prompt(id="a1", messages=[Message(role="user", content="Why is the sky blue?")], row=ROW)


def test_a_system_prompt_stays_in_front() -> None:
    prompt = prompt_of({"messages": [{"role": "system", "content": "Be brief."}, user("Hi")]})
    assert [m.role for m in prompt.messages] == ["system", "user"]


def test_trailing_assistant_turns_are_dropped_because_the_next_one_is_generated() -> None:
    prompt = prompt_of(
        {"messages": [user("1+1?"), assistant("2"), user("times 3?"), assistant("6"), assistant("!")]}
    )
    assert [m.content for m in prompt.messages] == ["1+1?", "2", "times 3?"]
    assert prompt.known_answer_chars == len("6") + len("!")  # the dataset's answer: a hint of the work


def test_a_row_without_an_answer_gives_no_hint_of_its_work() -> None:
    assert prompt_of({"messages": [user("1+1?"), assistant("2"), user("times 3?")]}).known_answer_chars == 0
    assert prompt_of({"prompt": "1+1?"}).known_answer_chars == 0


def test_text_content_parts_are_joined_without_a_separator() -> None:
    content = [{"type": "text", "text": "Translate: "}, {"type": "text", "text": "bonjour"}]
    prompt = prompt_of({"messages": [{"role": "user", "content": content}]})
    assert prompt.messages == [Message(role="user", content="Translate: bonjour")]


def test_the_developer_role_is_treated_as_system() -> None:
    prompt = prompt_of({"messages": [{"role": "developer", "content": "Answer in French."}, user("Hi")]})
    assert prompt.messages[0] == Message(role="system", content="Answer in French.")


def test_a_prompt_string_becomes_one_user_turn_after_its_optional_system_field() -> None:
    assert prompt_of({"prompt": "Hi"}).messages == [Message(role="user", content="Hi")]
    assert prompt_of({"prompt": "Hi", "system": "Be kind."}).messages == [
        Message(role="system", content="Be kind."),
        Message(role="user", content="Hi"),
    ]


def test_an_empty_or_null_system_field_means_no_system_prompt() -> None:
    assert prompt_of({"prompt": "Hi", "system": ""}).messages == [Message(role="user", content="Hi")]
    assert prompt_of({"prompt": "Hi", "system": None}).messages == [Message(role="user", content="Hi")]


def test_sharegpt_speakers_are_mapped_to_chat_roles() -> None:
    turns = [
        {"from": "system", "value": "S"},
        {"from": "human", "value": "a"},
        {"from": "gpt", "value": "b"},
        {"from": "user", "value": "c"},
        {"from": "chatgpt", "value": "d"},
        {"from": "bing", "value": "e"},
        {"from": "assistant", "value": "f"},
        {"from": "human", "value": "g"},
    ]
    prompt = prompt_of({"conversations": turns})
    assert [m.role for m in prompt.messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "assistant",
        "assistant",
        "user",
    ]


def test_a_sharegpt_row_with_a_system_column_gets_that_system_prompt() -> None:
    prompt = prompt_of({"system": "Be brief.", "conversations": [{"from": "human", "value": "Hi"}]})
    assert prompt.messages[0] == Message(role="system", content="Be brief.")


def test_a_system_field_equal_to_the_conversations_own_system_turn_is_kept_once() -> None:
    row = {"system": "S", "messages": [{"role": "system", "content": "S"}, user("Hi")]}
    assert [m.role for m in prompt_of(row).messages] == ["system", "user"]


def test_messages_win_over_conversations_and_prompt_when_a_row_has_several() -> None:
    prompt = prompt_of(
        {"prompt": "P", "conversations": [{"from": "human", "value": "C"}], "messages": [user("M")]}
    )
    assert prompt.messages == [Message(role="user", content="M")]


def test_a_null_format_field_counts_as_absent_as_in_a_parquet_column() -> None:
    assert prompt_of({"messages": None, "prompt": "P"}).messages == [Message(role="user", content="P")]


def test_content_is_kept_exactly_including_surrounding_whitespace() -> None:
    assert prompt_of({"prompt": "  indented\n"}).messages[0].content == "  indented\n"


def test_extra_fields_in_turns_and_parts_are_ignored() -> None:
    content = [{"type": "text", "text": "hi", "image_url": None}]
    prompt = prompt_of({"messages": [{"role": "user", "content": content, "name": None}], "response": "x"})
    assert prompt.messages == [Message(role="user", content="hi")]


USUAL_SHAPES = " (a turn is {role, content} or ShareGPT {from, value}; --turn-keys ROLE,TEXT reads others)"
MAPS_ROLES = " (--roles NAME=ROLE maps others)"


# --- rejections ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ([1, 2], "row: must be a JSON object, got list"),
        ("text", "row: must be a JSON object, got str"),
        (
            {"text": "hello", "answer": "hi"},
            "no messages, conversations or prompt field (its fields: text, answer; "
            "--prompt-field or --messages-field maps one)",
        ),
        ({"messages": "hello"}, "messages: must be a list of turns, got str"),
        ({"messages": []}, "messages: is empty"),
        ({"messages": ["hello"]}, "messages[0]: must be an object, got str"),
        ({"messages": [{"content": "hi"}]}, "messages[0].role: is missing" + USUAL_SHAPES),
        ({"messages": [{"role": "user"}]}, "messages[0].content: is missing" + USUAL_SHAPES),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content: is null"),
        ({"messages": [{"role": 3, "content": "hi"}]}, "messages[0].role: must be a string, got int"),
        (
            {"messages": [{"role": "user", "content": 42}]},
            "messages[0].content: must be a string or a list of content parts, got int",
        ),
        (
            {"messages": [{"role": "narrator", "content": "hi"}]},
            "messages[0].role: 'narrator' is not one of system, developer, user, assistant" + MAPS_ROLES,
        ),
        (
            {"messages": [user("hi"), {"role": "tool", "content": "42"}, user("and?")]},
            "messages[1].role: is 'tool'; tool turns are not supported",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages[0].content[0]: is a 'image_url' part; only text parts are supported",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "messages[0].content[0].text: must be a string, got int",
        ),
        ({"messages": [user("   \n\t")]}, "messages[0].content: is empty"),
        ({"messages": [user("hi"), assistant("yo"), user("")]}, "messages[2].content: is empty"),
        ({"messages": [{"role": "system", "content": "S"}]}, "messages: has no user turn"),
        ({"messages": [assistant("Hello!")]}, "messages: has no user turn"),
        (
            {"messages": [user("hi"), {"role": "system", "content": "S"}]},
            "messages: ends with a system turn; the turn before the reply must be a user turn",
        ),
        ({"prompt": ""}, "prompt: is empty"),
        ({"prompt": "   "}, "prompt: is empty"),
        ({"prompt": ["hi"]}, "prompt: must be a string, got list"),
        ({"prompt": "hi", "system": 1}, "system: must be a string, got int"),
        (
            {"system": "A", "messages": [{"role": "system", "content": "B"}, user("hi")]},
            "system: differs from the conversation's own system turn",
        ),
        ({"conversations": {"from": "human"}}, "conversations: must be a list of turns, got dict"),
        ({"conversations": [{"from": "human"}]}, "conversations[0].value: is missing" + USUAL_SHAPES),
        ({"conversations": [{"value": "hi"}]}, "conversations[0].from: is missing" + USUAL_SHAPES),
        (
            {"conversations": [{"from": "robot", "value": "hi"}]},
            "conversations[0].from: 'robot' is not one of system, human, user, gpt, assistant, chatgpt, bing"
            + MAPS_ROLES,
        ),
        (
            {"conversations": [{"from": "human", "value": "hi"}, {"from": "function_call", "value": "{}"}]},
            "conversations[1].from: is 'function_call'; tool turns are not supported",
        ),
        ({"conversations": [{"from": "human", "value": ""}]}, "conversations[0].value: is empty"),
        (
            {"conversations": [{"from": "human", "value": 1.5}]},
            "conversations[0].value: must be a string, got float",
        ),
    ],
)
def test_a_bad_row_is_rejected_with_a_reason_naming_the_field(raw: object, reason: str) -> None:
    assert reason_of(raw) == reason


def test_a_rejection_describes_its_file_and_row_for_a_folder_source() -> None:
    rejected = parse_row({"prompt": ""}, row=12, file="part-3.jsonl")
    assert isinstance(rejected, RejectedRow)
    assert rejected.describe() == "part-3.jsonl:12: prompt: is empty"
    assert RejectedRow(row=4, reason="r").describe() == "row 4: r"


def turn_by_turn_of(raw: object) -> Prompt:
    result = parse_row(raw, row=ROW, turns=Turns.ALL)
    assert isinstance(result, Prompt), result
    return result


def test_turn_by_turn_leaves_the_datasets_assistant_turns_out_and_marks_where_each_turn_ends() -> None:
    raw = {
        "messages": [
            {"role": "system", "content": "s"},
            user("q1"),
            assistant("a1"),
            user("q2"),
            assistant("a2"),
        ]
    }
    prompt = turn_by_turn_of(raw)
    assert [m.content for m in prompt.messages] == ["s", "q1", "q2"]
    assert prompt.turn_ends == [2, 3]
    assert [m.content for m in prompt.request_messages(["new a1"])] == ["s", "q1", "new a1", "q2"]
    assert prompt.known_answer_chars == len("a1") + len("a2")  # every answer the run writes again


def test_a_rows_id_is_the_same_whichever_turns_the_run_regenerates() -> None:
    raw = {
        "conversations": [
            {"from": "human", "value": "q1"},
            {"from": "gpt", "value": "a1"},
            {"from": "human", "value": "q2"},
        ]
    }
    assert turn_by_turn_of(raw).id == prompt_of(raw).id


def test_consecutive_user_turns_are_one_turn_as_the_dataset_answered_them_once() -> None:
    raw = {"messages": [user("q1"), user("q1 again"), assistant("a1"), user("q2")]}
    assert turn_by_turn_of(raw).turn_ends == [2, 3]


def test_a_one_turn_row_is_one_request_whichever_turns_the_run_regenerates() -> None:
    raw = {"messages": [assistant("greeting"), user("q"), assistant("a")]}
    prompt = turn_by_turn_of(raw)
    assert (prompt.turn_ends, [m.content for m in prompt.messages]) == ([], ["q"])


# --- a run's own column names -------------------------------------------------------------


def test_a_mapped_prompt_field_reads_the_prompt_and_the_system_and_id_from_the_columns_named() -> None:
    fields = RowFields.mapped(prompt="question", system="instruction", id_field="uid")
    raw = {"question": "What is 2+2?", "instruction": "Be brief.", "uid": "u-7", "id": "not this one"}
    prompt = parse_row(raw, row=ROW, fields=fields)
    assert isinstance(prompt, Prompt)
    assert prompt.id == "u-7"
    assert prompt.messages == [
        Message(role="system", content="Be brief."),
        Message(role="user", content="What is 2+2?"),
    ]


def test_a_mapped_prompt_field_replaces_the_default_ones_so_no_other_column_is_read_as_the_prompt() -> None:
    result = parse_row({"prompt": "the wrong column"}, row=ROW, fields=RowFields.mapped(prompt="question"))
    assert isinstance(result, RejectedRow)
    assert result.reason.startswith("no question field (its fields: prompt;")


def test_a_mapped_messages_field_reads_turns_in_either_shape_to_the_same_prompt_and_id() -> None:
    fields = RowFields.mapped(messages="dialog")
    openai = parse_row({"dialog": [user("hi"), assistant("yo"), user("and?")]}, row=ROW, fields=fields)
    sharegpt_turns = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]
    sharegpt = parse_row(
        {"dialog": [*sharegpt_turns, {"from": "human", "value": "and?"}]}, row=ROW, fields=fields
    )
    assert isinstance(openai, Prompt) and isinstance(sharegpt, Prompt)
    assert (openai.id, openai.messages) == (sharegpt.id, sharegpt.messages)


def test_a_rejection_in_a_mapped_field_names_that_field() -> None:
    fields = RowFields.mapped(messages="dialog")
    result = parse_row({"dialog": [{"from": "human", "value": ""}]}, row=ROW, fields=fields)
    assert isinstance(result, RejectedRow) and result.reason == "dialog[0].value: is empty"


def test_a_row_of_more_turns_than_any_conversation_has_is_rejected_with_the_count() -> None:
    turns = [user("hi"), assistant("yo")] * (MAX_TURNS // 2 + 1)
    assert reason_of({"messages": turns}) == f"messages: holds {len(turns):,} turns, more than {MAX_TURNS:,}"


def test_content_of_more_parts_than_the_cap_is_rejected_with_the_count() -> None:
    parts = [{"type": "text", "text": "x"}] * (MAX_CONTENT_PARTS + 1)
    assert reason_of({"messages": [{"role": "user", "content": parts}]}) == (
        f"messages[0].content: holds {len(parts):,} content parts, more than {MAX_CONTENT_PARTS:,}"
    )


# --- a dataset's own chat shape ------------------------------------------------------------


OWN_CHATS = RowFields.mapped(
    messages="dialog",
    id_field="conv_id",
    turn_keys=("speaker", "text"),
    roles={"human": "user", "bot": "assistant"},
)


def test_turns_of_a_shape_of_their_own_are_read_by_the_run_s_turn_keys_and_role_names() -> None:
    raw = {
        "conv_id": "c-1",
        "dialog": [
            {"speaker": "human", "text": "Hi"},
            {"speaker": "bot", "text": "Hello"},
            {"speaker": "human", "text": "Tell me a joke"},
        ],
    }
    result = parse_row(raw, row=ROW, fields=OWN_CHATS)
    assert isinstance(result, Prompt), result
    assert result.id == "c-1"
    assert result.messages == [
        Message(role="user", content="Hi"),
        Message(role="assistant", content="Hello"),
        Message(role="user", content="Tell me a joke"),
    ]
    same_in_openai_shape = parse_row(
        {"messages": [user("Hi"), assistant("Hello"), user("Tell me a joke")]}, row=ROW
    )
    assert isinstance(same_in_openai_shape, Prompt)
    assert same_in_openai_shape.messages == result.messages


@pytest.mark.parametrize(
    ("turn", "reason"),
    [
        ({"text": "Hi"}, "dialog[0].speaker: is missing (a turn is {speaker, text}, as --turn-keys says)"),
        (
            {"speaker": "human", "content": "Hi"},
            "dialog[0].text: is missing (a turn is {speaker, text}, as --turn-keys says)",
        ),
        (
            {"speaker": "narrator", "text": "Once"},
            "dialog[0].speaker: 'narrator' is not one of system, user, assistant, human, bot" + MAPS_ROLES,
        ),
    ],
)
def test_a_turn_that_does_not_fit_the_run_s_shape_is_rejected_naming_the_shape(
    turn: object, reason: str
) -> None:
    rejected = parse_row({"dialog": [turn]}, row=ROW, fields=OWN_CHATS)
    assert isinstance(rejected, RejectedRow)
    assert rejected.reason == reason


def test_the_run_s_role_names_join_those_of_the_usual_shapes() -> None:
    fields = RowFields.mapped(roles={"bot": "assistant", "human": "user"})
    raw = {"messages": [{"role": "human", "content": "Hi"}, {"role": "bot", "content": "Yo"}, user("Again")]}
    result = parse_row(raw, row=ROW, fields=fields)
    assert isinstance(result, Prompt), result
    assert [m.role for m in result.messages] == ["user", "assistant", "user"]
