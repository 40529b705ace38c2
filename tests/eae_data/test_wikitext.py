"""parse_wikitext / normalize_title: exact plain text and spans on hand-written wikitext, and
span invariants on generated wikitext (hypothesis)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eae_data.wikitext import Link, normalize_title, parse_wikitext


def spans_of(parsed) -> list[tuple[int, int, str, str]]:
    return [(l.start, l.end, l.target, l.anchor) for l in parsed.links]


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("Apple", "Apple"),
        ("apple", "Apple"),
        ("  apple_pie  ", "Apple pie"),
        ("new  york\tcity", "New york city"),
        ("Pear tree#Fruit", "Pear tree"),
        ("AT&amp;T", "AT&T"),
        ("Caf%C3%A9", "Café"),
        (":Apple", "Apple"),
        ("élan", "Élan"),
        ("ß-test", "ß-test"),  # 'ß'.upper() is two letters: kept as MediaWiki does
        ("Alien: Resurrection", "Alien: Resurrection"),  # a colon without a known prefix
        ("#Section", None),
        (" ", None),
        ("", None),
        ("File:Cat.jpg", None),
        ("image:Cat.jpg", None),
        ("Category:Dogs", None),
        (":Category:Dogs", None),
        ("Template:Infobox", None),
        ("Wikipedia:Citation needed", None),
        ("WP:NPOV", None),
        ("Help:Contents", None),
        ("Portal:Science", None),
        ("User:Bob", None),
        ("User_talk:Bob", None),
        ("Talk:Apple", None),
        ("Special:Random", None),
        ("Media:Sound.ogg", None),
        ("Draft:Thing", None),
        ("Module:Arguments", None),
        ("fr:Paris", None),
        ("zh-min-nan:Paris", None),
        ("wikt:dog", None),
        ("wiktionary:dog", None),
        ("Foo<bar", None),
        ("Foo{{bar}}", None),
    ],
)
def test_normalize_title(raw, expected):
    assert normalize_title(raw) == expected


@pytest.mark.parametrize(
    "wikitext, text, links",
    [
        ("[[Apple]] is red.", "Apple is red.", [(0, 5, "Apple", "Apple")]),
        ("Eat [[Apple|an apple]] now.", "Eat an apple now.", [(4, 12, "Apple", "an apple")]),
        # case and underscores: the target is normalised, the anchor is shown as written
        (
            "[[apple_pie]] and [[ new  york ]]",
            "apple_pie and new york",
            [(0, 9, "Apple pie", "apple_pie"), (14, 22, "New york", "new york")],
        ),
        (
            "[[Pear tree#Fruit|pears]] and [[Pear tree#Fruit]]",
            "pears and Pear tree#Fruit",
            [(0, 5, "Pear tree", "pears"), (10, 25, "Pear tree", "Pear tree#Fruit")],
        ),
        # link trails: following lowercase letters only
        (
            "[[apple]]s, [[apple]]'s, [[apple]]Xs, [[bus]]es.",
            "apples, apple's, appleXs, buses.",
            [(0, 6, "Apple", "apples"), (8, 13, "Apple", "apple"), (17, 22, "Apple", "apple"),
             (26, 31, "Bus", "buses")],
        ),
        ("[[a]]<nowiki/>s", "as", [(0, 1, "A", "a")]),  # <nowiki/> stops the trail
        ("A {{a|{{b|c}}|[[d]]}} B", "A B", []),
        ("{{Infobox\n| name = x\n|}}\nBody [[B]].", "Body B.", [(5, 6, "B", "B")]),
        ("a {{foo b }} c }} d", "a c d", []),  # a stray closer is dropped
        (
            'Fact.<ref>See [[Source]].</ref> More.<ref name="x" /> End.<ref name=y>y</ref>',
            "Fact. More. End.",
            [],
        ),
        ("a <!-- [[x]] --> b <!-- unclosed", "a b", []),
        (
            'Before.\n{| class="wikitable"\n|-\n| [[Cell]] || {|\n| inner [[Deep]]\n|}\n|}\nAfter [[Z]].',
            "Before.\n\nAfter Z.",
            [(15, 16, "Z", "Z")],
        ),
        (
            "[[File:Cat.jpg|thumb|A [[cat]] on a [[Mat|mat]]]]The [[cat]] sat.[[Image:x.png]]",
            "The cat sat.",
            [(4, 7, "Cat", "cat")],
        ),
        ("Dogs.\n[[Category:Dogs]]\n[[Category:Pets| ]]", "Dogs.", []),
        (
            "See [http://example.com Example site] and [http://bare.com] or http://x.org.",
            "See Example site and or http://x.org.",
            [],
        ),
        (
            "AT&amp;T&nbsp;Inc, &lt;b&gt; &#8212; [[AT&amp;T]]",
            "AT&T Inc, <b> — AT&T",
            [(16, 20, "AT&T", "AT&T")],
        ),
        (
            "'''Bold''' and ''italic'' and '''''both''''' and [[X|'''y''']].",
            "Bold and italic and both and y.",
            [(29, 30, "X", "y")],
        ),
        (
            "Intro.\n\n\n\n== History ==\nText.\n=== Sub ===\nMore.",
            "Intro.\n\nHistory\nText.\nSub\nMore.",
            [],
        ),
        (
            "* one [[A]]\n# two\n: three\n; term : def\n----\nend",
            "one A\ntwo\nthree\nterm : def\n\nend",
            [(4, 5, "A", "A")],
        ),
        # other namespaces and interwiki: visible text kept, not a link; categories,
        # files and interlanguage links render nothing
        (
            "[[Wikipedia:Citation needed|citation]] [[wikt:foo|foo]] [[fr:Paris]] "
            "[[:Category:Cats|cats]] [[User:Bob]]",
            "citation foo cats User:Bob",
            [],
        ),
        ("[[#History|see below]] [[ ]] [[#Top]]", "see below #Top", []),
        (
            "[[Paris (film)|]] [[Paris, Texas|]] [[Help:Contents|]]",
            "Paris Paris Contents",
            [(0, 5, "Paris (film)", "Paris"), (6, 11, "Paris, Texas", "Paris")],
        ),
        ("x [[Foo|{{bar}}]] y [[Foo|<ref>r</ref>]] z", "x y z", []),
        ("__TOC__ text __NOTOC__", "text", []),
        (
            '<math>\\frac{1}{2}</math> is [[One half|half]]. <span style="x">kept</span> <div>block</div>',
            "is half. kept\nblock",
            [(3, 7, "One half", "half")],
        ),
        (
            "[[Foo|bar|baz]] [[Foo|a [b] c]]",
            "bar|baz a [b] c",
            [(0, 7, "Foo", "bar|baz"), (8, 15, "Foo", "a [b] c")],
        ),
    ],
)
def test_parse_exact(wikitext, text, links):
    parsed = parse_wikitext(wikitext)
    assert parsed.text == text
    assert spans_of(parsed) == links


def test_skipped_links_are_counted_by_reason():
    parsed = parse_wikitext(
        "[[File:Cat.jpg|thumb|A [[cat]] on a [[mat]]]] {{cite|[[Source]]}}<ref>[[R]]</ref> "
        "[[Category:Cats]] [[wikt:cat|cat]] [[fr:Chat]] [[#Top|top]] [[ ]] [[Foo|{{x}}]] [[Ok]]"
    )
    assert parsed.text == "cat top Ok"
    assert spans_of(parsed) == [(8, 10, "Ok", "Ok")]
    assert parsed.skipped == {
        "inside_dropped_markup": 4,  # cat, mat (caption), Source (template), R (ref)
        "non_article_namespace": 3,  # File, Category, wikt
        "interlanguage": 1,
        "empty_target": 2,
        "empty_anchor": 1,
    }


def test_private_use_markers_in_input_are_ignored():
    parsed = parse_wikitext("a\ue000b [[C]]\ue001 d\ue002")
    assert parsed.text == "ab C d"
    assert spans_of(parsed) == [(3, 4, "C", "C")]


# --------------------------------------------------------------------------- properties

_word = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=1, max_size=8)
_lower = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=4)
_anchor = st.lists(_word, min_size=1, max_size=3).map(" ".join)
_link = st.tuples(_anchor, st.one_of(st.none(), _anchor), st.one_of(st.just(""), _lower))
_noise = st.sampled_from(["{{cite|x=[[Hidden]]}}", "<ref>[[R]]</ref>", "<!-- c -->", "''", "'''"])
_token = st.one_of(
    _word.map(lambda w: ("word", w)),
    _link.map(lambda l: ("link",) + l),
    _noise.map(lambda n: ("noise", n)),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(_token, max_size=25))
def test_generated_links_have_exact_spans(tokens):
    source, shown, expected = [], [], []
    for tok in tokens:
        if tok[0] == "word":
            source.append(tok[1])
            shown.append(tok[1])
        elif tok[0] == "noise":
            source.append(tok[1])
        else:
            _, target, anchor, trail = tok
            source.append(f"[[{target}|{anchor}]]{trail}" if anchor else f"[[{target}]]{trail}")
            shown.append((anchor or target) + trail)
            expected.append((normalize_title(target), shown[-1]))
    parsed = parse_wikitext(" ".join(source))
    assert parsed.text == " ".join(shown)
    assert [(l.target, l.anchor) for l in parsed.links] == expected
    check_spans(parsed.text, parsed.links)


def check_spans(text: str, links: list[Link]) -> None:
    end = 0
    for link in links:
        assert end <= link.start < link.end <= len(text)
        assert text[link.start : link.end] == link.anchor
        assert link.anchor == link.anchor.strip()
        end = link.end


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="[]{}|'<>=*#:!-&; \nabcAB/", max_size=200))
def test_arbitrary_markup_never_breaks_spans(wikitext):
    parsed = parse_wikitext(wikitext)
    check_spans(parsed.text, parsed.links)
    assert all(ch not in parsed.text for ch in "\ue000\ue001\ue002")
