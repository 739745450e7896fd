"""The demo world in Flickr30K Entities' layout, with dependency parses of its captions, for
`vlbert analyze grounding --format flickr30k-entities` and `vlbert analyze syntax` to read.

The world's captions come from three templates (`language.captions`), so their parses are known by
construction: each caption is rebuilt here as words with heads and Universal Dependencies
relations, rendered, and checked against the caption the world wrote (a template changed without
this module fails loudly rather than writing a wrong parse). Written under `out`:

- `<split>.txt`: the split's image ids, one a line (train, val);
- `Sentences/<id>.txt`: the captions, entities bracketed (`[/EN#1/other a red circle]`): each object
  (its id the same in every caption of the image, as Flickr30K Entities chains coreferent phrases),
  "N shapes" (every object: scored against the union of their boxes), the background and "the
  picture" (scenes, without a box);
- `Annotations/<id>.xml`: the objects' boxes, each named by the entities it belongs to;
- `<split>.conllu`: one parse per caption, in the order of `<split>.txt` and of the Sentences lines;
- `flickr30k-images/<id>.png`: hard links to the world's images (copies where none can be made),
  so that `vlbert extract` on `out` stores them under `flickr30k-images/<id>`.

The third caption names two objects by their description; where two pairs of the scene fit it,
which boxes it means is unknown, and its two phrases are left unbracketed.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.world.generate import SPLITS, load_split
from pipelines.world.language import BACKGROUND_WORDS, object_name, spatial_relation, with_article
from pipelines.world.nlvr2 import link_file
from pipelines.world.scene import SceneObject
from pipelines.world.vocabulary import NUMBER_WORDS
from vlbert.utils.atomic import made_folder, write_atomically


@dataclass
class Token:
    form: str
    upos: str
    head: int = 0  # a word id from 1; 0: the root
    relation: str = "root"
    space_after: bool = True


@dataclass
class Sentence:
    """A caption being built: its words, and its entities as (first word, last word, entity id, type)."""

    tokens: list[Token] = field(default_factory=list)
    entities: list[tuple[int, int, int, str]] = field(default_factory=list)

    def add(self, form: str, upos: str) -> int:
        self.tokens.append(Token(form, upos))
        return len(self.tokens)

    def attach(self, word: int, head: int, relation: str) -> None:
        self.tokens[word - 1].head, self.tokens[word - 1].relation = head, relation

    def punctuation(self, form: str, head: int) -> int:
        self.tokens[-1].space_after = False
        word = self.add(form, "PUNCT")
        self.attach(word, head, "punct")
        return word

    def noun_phrase(self, obj: SceneObject, entity: int | None) -> int:
        """A noun phrase ("a small red circle"): det and amod on the shape, the phrase an entity (None:
        unbracketed)."""
        article, *modifiers, shape = with_article(object_name(obj)).split()
        first = self.add(article, "DET")
        adjectives = [self.add(word, "ADJ") for word in modifiers]
        noun = self.add(shape, "NOUN")
        self.attach(first, noun, "det")
        for adjective in adjectives:
            self.attach(adjective, noun, "amod")
        if entity is not None:
            self.entities.append((first, noun, entity, "other"))
        return noun

    def text(self) -> str:
        return "".join(token.form + (" " if token.space_after else "") for token in self.tokens).strip()

    def bracketed(self) -> str:
        """The caption as a Flickr30K Entities Sentences line."""
        starts = {first: (entity, kind) for first, _, entity, kind in self.entities}
        ends = {last for _, last, _, _ in self.entities}
        line = ""
        for word, token in enumerate(self.tokens, 1):
            if word in starts:
                line += f"[/EN#{starts[word][0]}/{starts[word][1]} "
            line += token.form + ("]" if word in ends else "") + (" " if token.space_after else "")
        return line.strip()

    def conllu(self, sent_id: str) -> str:
        rows = [f"{word}\t{token.form}\t_\t{token.upos}\t_\t_\t{token.head}\t{token.relation}\t_\t"
                f"{'_' if token.space_after else 'SpaceAfter=No'}" for word, token in enumerate(self.tokens, 1)]
        return f"# sent_id = {sent_id}\n# text = {self.text()}\n" + "\n".join(rows) + "\n\n"


@dataclass(frozen=True)
class Entities:
    """An image's entity ids: object k is k + 1, then every object ("N shapes") and two scenes."""

    objects: int

    @property
    def every_object(self) -> int:
        return self.objects + 1

    @property
    def background(self) -> int:
        return self.objects + 2

    @property
    def picture(self) -> int:
        return self.objects + 3


def listing(objects: tuple[SceneObject, ...], background: str, ids: Entities) -> Sentence:
    """The first caption ("a red circle, a blue square and a star on a noisy background."): the
    first shape the root, the others its conjuncts (a comma or "and" hangs on the conjunct after it,
    as UD attaches them)."""
    sentence = Sentence()
    root = 0
    for k, obj in enumerate(objects):
        joint = None
        if 0 < k < len(objects) - 1:
            sentence.tokens[-1].space_after = False
            joint = sentence.add(",", "PUNCT"), "punct"
        elif k and k == len(objects) - 1:
            joint = sentence.add("and", "CCONJ"), "cc"
        noun = sentence.noun_phrase(obj, k + 1)
        if joint is not None:
            sentence.attach(joint[0], noun, joint[1])
        if k:
            sentence.attach(noun, root, "conj")
        else:
            root = noun
    _prepositional(sentence, root, "on", ["a", BACKGROUND_WORDS[background], "background"], ids.background)
    sentence.punctuation(".", root)
    return sentence


def _prepositional(sentence: Sentence, head: int, preposition: str, words: list[str], entity: int,
                   relation: str = "nmod") -> int:
    """A prepositional phrase ("on a noisy background") hung on `head` (case and det, amod on the
    noun), a scene entity."""
    case = sentence.add(preposition, "ADP")
    first = sentence.add(words[0], "DET")
    adjectives = [sentence.add(word, "ADJ") for word in words[1:-1]]
    noun = sentence.add(words[-1], "NOUN")
    sentence.attach(case, noun, "case")
    sentence.attach(first, noun, "det")
    for adjective in adjectives:
        sentence.attach(adjective, noun, "amod")
    sentence.attach(noun, head, relation)
    sentence.entities.append((first, noun, entity, "scene"))
    return noun


def counting(objects: tuple[SceneObject, ...], ids: Entities) -> Sentence:
    """The second caption ("there are three shapes in the picture."): existential be the root, "three
    shapes" its subject (every object, scored against the union of their boxes)."""
    sentence = Sentence()
    one = len(objects) == 1
    there = sentence.add("there", "PRON")
    root = sentence.add("is" if one else "are", "VERB")
    number = sentence.add(NUMBER_WORDS[len(objects)], "NUM")
    noun = sentence.add("shape" if one else "shapes", "NOUN")
    sentence.attach(there, root, "expl")
    sentence.attach(number, noun, "nummod")
    sentence.attach(noun, root, "nsubj")
    sentence.entities.append((number, noun, ids.every_object, "other"))
    _prepositional(sentence, root, "in", ["the", "picture"], ids.picture, "obl")  # a clause's: obl, not nmod
    sentence.punctuation(".", root)
    return sentence


def placing(objects: tuple[SceneObject, ...], i: int, j: int, bracketed: bool) -> Sentence:
    """The third caption ("a red circle to the left of a blue square.", or above, below): the first
    shape the root; "to the left of" a nmod with its own case and det, the second shape hung on "left"."""
    sentence = Sentence()
    root = sentence.noun_phrase(objects[i], i + 1 if bracketed else None)
    relation = spatial_relation(objects[i], objects[j]).split()
    if len(relation) == 1:  # above, below: a preposition
        case = sentence.add(relation[0], "ADP")
        other = sentence.noun_phrase(objects[j], j + 1 if bracketed else None)
        sentence.attach(case, other, "case")
        sentence.attach(other, root, "nmod")
    else:  # to the left of
        case, article, side, of = (sentence.add(word, tag)
                                   for word, tag in zip(relation, ("ADP", "DET", "NOUN", "ADP")))
        other = sentence.noun_phrase(objects[j], j + 1 if bracketed else None)
        sentence.attach(case, side, "case")
        sentence.attach(article, side, "det")
        sentence.attach(side, root, "nmod")
        sentence.attach(of, other, "case")
        sentence.attach(other, side, "nmod")
    sentence.punctuation(".", root)
    return sentence


def alone(objects: tuple[SceneObject, ...], ids: Entities) -> Sentence:
    """The third caption where no two objects are clearly apart ("a picture with a red circle and nothing
    else."): "picture" the root (a scene)."""
    sentence = Sentence()
    article = sentence.add("a", "DET")
    root = sentence.add("picture", "NOUN")
    sentence.attach(article, root, "det")
    sentence.entities.append((article, root, ids.picture, "scene"))
    case = sentence.add("with", "ADP")
    noun = sentence.noun_phrase(objects[0], 1)
    sentence.attach(case, noun, "case")
    sentence.attach(noun, root, "nmod")
    conjunction, nothing = sentence.add("and", "CCONJ"), sentence.add("nothing", "PRON")
    other = sentence.add("else", "ADV")
    sentence.attach(conjunction, nothing, "cc")
    sentence.attach(nothing, noun, "conj")
    sentence.attach(other, nothing, "advmod")
    sentence.punctuation(".", root)
    return sentence


def scene_objects(record: dict[str, Any]) -> tuple[SceneObject, ...]:
    """The record's objects as far as the caption templates read them (names and centres)."""
    return tuple(SceneObject(obj["class"], obj["attributes"][0], obj["attributes"][1] if len(obj["attributes"]) > 1
                             else "medium", 0, 0, 0, tuple(obj["box"])) for obj in record["objects"])


def caption_parses(record: dict[str, Any]) -> list[Sentence]:
    """The record's captions rebuilt as parsed sentences, each checked against the caption written;
    ValueError where one is not (the templates changed)."""
    objects, ids = scene_objects(record), Entities(len(record["objects"]))
    first, second, third = record["captions"]
    built = [listing(objects, record["background"], ids), counting(objects, ids)]
    pairs = [(i, j) for i in range(len(objects)) for j in range(len(objects))
             if i != j and spatial_relation(objects[i], objects[j]) and placing(objects, i, j, False).text() == third]
    if pairs:
        meant = {(objects[i].box, objects[j].box) for i, j in pairs}
        built.append(placing(objects, *pairs[0], bracketed=len(meant) == 1))
    else:
        built.append(alone(objects, ids))
    for sentence, caption in zip(built, (first, second, third)):
        if sentence.text() != caption:
            raise ValueError(f"image {record['id']}: the caption {caption!r} is not the template's "
                             f"{sentence.text()!r}; pipelines/world/entities.py must follow language.captions")
    return built


def annotation_xml(record: dict[str, Any], ids: Entities) -> str:
    """Annotations/<id>.xml: each object's box named by its own entity and "every object"; the scenes."""
    root = ElementTree.Element("annotation")
    ElementTree.SubElement(root, "filename").text = f"{record['id']}.jpg"
    size = ElementTree.SubElement(root, "size")
    for name, value in (("width", record["width"]), ("height", record["height"]), ("depth", 3)):
        ElementTree.SubElement(size, name).text = str(value)
    for k, obj in enumerate(record["objects"]):
        element = ElementTree.SubElement(root, "object")
        for entity in (k + 1, ids.every_object):
            ElementTree.SubElement(element, "name").text = str(entity)
        box = ElementTree.SubElement(element, "bndbox")
        for name, value in zip(("xmin", "ymin", "xmax", "ymax"), obj["box"]):
            ElementTree.SubElement(box, name).text = str(value)
    for entity in (ids.background, ids.picture):
        element = ElementTree.SubElement(root, "object")
        ElementTree.SubElement(element, "name").text = str(entity)
        ElementTree.SubElement(element, "scene").text = "1"
    return ElementTree.tostring(root, encoding="unicode") + "\n"


def write_world_entities(world: str | Path, out: str | Path) -> dict[str, int]:
    """Writes the world's splits in Flickr30K Entities' layout with CoNLL-U parses under `out`;
    returns each split's number of captions."""
    world, out = Path(world), Path(out)
    splits = {split: load_split(world, split) for split in SPLITS}  # a folder that is no world: nothing written
    for folder in ("Sentences", "Annotations", "flickr30k-images"):
        made_folder(out / folder)
    counts = {}
    for split, records in splits.items():
        parses = []
        for record in records:
            sentences = caption_parses(record)
            write_atomically(out / "Sentences" / f"{record['id']}.txt",
                             "".join(sentence.bracketed() + "\n" for sentence in sentences))
            write_atomically(out / "Annotations" / f"{record['id']}.xml",
                             annotation_xml(record, Entities(len(record["objects"]))))
            link_file(world / record["file"], out / "flickr30k-images" / f"{record['id']}.png")
            parses += [sentence.conllu(f"{record['id']}/{number}") for number, sentence in enumerate(sentences)]
        write_atomically(out / f"{split}.txt", "".join(record["id"] + "\n" for record in records))
        write_atomically(out / f"{split}.conllu", "".join(parses))
        counts[split] = len(parses)
    return counts
