import random

from odqa.common.answer_index import AnswerIndex
from odqa.common.metrics.has_answer import has_answer

TEXTS = [
    "The Beatles formed in Liverpool in 1960.",
    "Liverpool is a city in England.",
    "Mount Everest is 8,849 metres tall.",
    "Kansas is in the middle of the United States",
    "the state of Kansas",
    "",
    "Röntgen discovered X-rays in 1895.",
]


def brute_force(answers, regex=False):
    return [i for i, t in enumerate(TEXTS) if has_answer(t, answers, regex)]


def test_find_equals_brute_force_has_answer():
    index = AnswerIndex(TEXTS)
    cases = [["Liverpool"], ["liverpool in 1960"], ["8,849 metres"], ["8849"], ["X-rays"],
             ["Kansas", "Beatles"], ["not there"], ["in"], [""], ["Röntgen"]]
    for answers in cases:
        assert index.find(answers) == brute_force(answers), answers


def test_regex_find_equals_brute_force_including_matches_across_joins():
    index = AnswerIndex(TEXTS)
    # "States\nthe state" would match across the join of passages 3 and 4; per passage it must not.
    cases = [[r"kansas"], [r"^the state"], [r"States$"], [r"States.the"], [r"States\sthe"], [r"8,?849"],
             [r".*"], [r"(unclosed"], [r"Unit.*of Kansas"]]
    for answers in cases:
        assert index.find(answers, regex=True) == brute_force(answers, regex=True), answers


def test_find_on_random_corpus():
    rng = random.Random(0)
    vocab = "alpha beta gamma delta epsilon zeta eta theta".split()
    texts = [" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 30))) for _ in range(200)]
    index = AnswerIndex(texts)
    for _ in range(50):
        answer = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 3)))
        assert index.find([answer]) == [i for i, t in enumerate(texts) if has_answer(t, [answer])]
