from core.records import Quality
from inference.quality import label_completion


def label(content: str, reasoning: str | None, finish: str, thinking: bool = True) -> Quality:
    return label_completion(
        content=content, reasoning_content=reasoning, finish_reason=finish, thinking_enabled=thinking
    )


def test_a_budget_hit_inside_thinking_is_truncated_in_thinking() -> None:
    assert label("", "\nlong thought", "length") is Quality.TRUNCATED_IN_THINKING


def test_a_budget_hit_after_the_answer_started_is_truncated_in_answer() -> None:
    assert label("\n\nThe answer is", "\nthought\n", "length") is Quality.TRUNCATED_IN_ANSWER


def test_a_model_that_stops_inside_thinking_gave_an_empty_answer() -> None:
    assert label("", "\nthought", "stop") is Quality.EMPTY_ANSWER


def test_a_whitespace_answer_is_empty() -> None:
    assert label("\n\n  ", "\nthought\n", "stop") is Quality.EMPTY_ANSWER


def test_an_answer_without_reasoning_while_thinking_was_on_is_flagged() -> None:
    assert label("42", None, "stop") is Quality.NO_REASONING


def test_an_answer_without_reasoning_is_fine_when_thinking_was_off() -> None:
    assert label("42", None, "stop", thinking=False) is Quality.OK


def test_a_budget_hit_with_thinking_off_is_truncated_in_answer() -> None:
    assert label("", None, "length", thinking=False) is Quality.TRUNCATED_IN_ANSWER


def test_reasoning_then_answer_then_stop_is_ok() -> None:
    assert label("\n\n42", "\nthought\n", "stop") is Quality.OK
