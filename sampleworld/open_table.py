"""Build the open world's glyph table (open_assets/glyphs.tsv) from a curated list of emoji code points.

Each entry is one single-code-point emoji of a concrete thing in Noto Color Emoji. Its noun is cleaned from
the Unicode name by rules (lower case; "FACE", "BLACK", "WHITE", "HEAVY", "LOWER LEFT", "WOMANS", "MANS"
dropped: "DOG FACE" -> "dog", "BLACK SCISSORS" -> "scissors") unless the list gives one ("RED APPLE" ->
"apple", "DECIDUOUS TREE" -> "tree"); the table records the Unicode name, the cleaned name and which of the
two was kept. People, body parts, flags, symbols, faces and anything not a concrete noun are simply not
listed. Groups hold near neighbours (a noun twin swaps within a group: dog/wolf, car/taxi, apple/pear);
categories hold groups. ``<`` / ``>`` marks a glyph that faces left / right as drawn (checked by eye on the
rendered sprites); only those get facing words and facing twins.

Run ``python -m edje.sampleworld build-table`` to rewrite the TSV (it needs only ``unicodedata``).
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "open_assets"
TABLE_PATH = ASSETS / "glyphs.tsv"
COLUMNS = ("codepoint", "unicode_name", "cleaned", "noun", "noun_from", "plural", "category", "group",
           "synonyms", "facing")

# One line per group (indented lines continue it): "category/group: TOKEN TOKEN ...".
# TOKEN = CODEPOINT[=noun][/plural][(syn|syn/plural)][<|>]; underscores stand for spaces. Plurals not given follow English rules (_plural).
CURATED = """
animal/canine: 1F415(hound)< 1F429< 1F43A/wolves 1F98A 1F9AE<
animal/feline: 1F408(kitty)< 1F405< 1F406< 1F981
animal/bovine: 1F402/oxen< 1F403/water_buffaloes< 1F404< 1F9AC/bison<
animal/sheep and goats: 1F40F< 1F410< 1F411/sheep<
animal/swine: 1F416(hog)< 1F417<
animal/equine: 1F40E< 1F984< 1F993<
animal/long-necked: 1F98C/deer< 1F992< 1F42A=dromedary< 1F42B=camel< 1F999<
animal/primate: 1F412 1F98D< 1F9A7
animal/bear: 1F43B 1F43C 1F428 1F998<
animal/rodent: 1F400< 1F401/mice< 1F439 1F43F< 1F407(bunny)< 1F994<
animal/woodland: 1F99D 1F9A1< 1F9A8< 1F9A6< 1F9A5 1F9AB< 1F987
animal/large mammal: 1F418< 1F98F(rhino)< 1F99B(hippo)< 1F9A3<
animal/poultry: 1F413(cockerel)< 1F414(hen)< 1F424< 1F983< 1F986<
animal/bird: 1F426< 1F427 1F54A=dove(pigeon)< 1F985< 1F989 1F99A 1F99C< 1F9A2< 1F9A9< 1F9A4<
animal/reptile: 1F40A< 1F40D(serpent)< 1F422(tortoise)< 1F98E 1F438 1F409<
animal/prehistoric: 1F995(brontosaurus)< 1F996=tyrannosaurus<
animal/sea mammal: 1F40B< 1F42C< 1F9AD<
animal/fish: 1F41F/fish< 1F420/tropical_fish< 1F421=pufferfish/pufferfish(blowfish/blowfish)< 1F988<
animal/sea life: 1F419/octopuses 1F991/squid 1F41A=seashell(shell) 1F9AA 1FAB8
animal/crustacean: 1F980 1F99E 1F990/shrimp(prawn)<
animal/insect: 1F41B=caterpillar 1F41C< 1F41D=bee(honeybee)< 1F41E=ladybug(ladybird) 1F98B 1F997(grasshopper)< 1F99F/mosquitoes<
    1FAB0/flies 1FAB2 1FAB3(roach)
animal/crawler: 1F40C< 1F577 1F982 1FAB1<
food/fruit: 1F34E=apple 1F34F 1F350 1F351 1F34A=orange(tangerine) 1F34B 1F34C 1F34D 1F352=cherry/cherries 1F353 1F348 1F349
    1F95D=kiwi(kiwifruit) 1F96D 1F965 1FAD0=blueberry/blueberries 1F347=bunch_of_grapes/bunches_of_grapes 1F951
food/vegetable: 1F345/tomatoes 1F346=eggplant(aubergine) 1F955 1F954/potatoes 1F952 1F966/broccoli 1F96C=lettuce 1F9C4=garlic_bulb
    1F9C5 1FAD1(capsicum) 1F336=chili_pepper 1F33D=corncob(ear_of_corn/ears_of_corn) 1F344
    1F360=sweet_potato/sweet_potatoes 1FAD2 1FAD8=bean 1F330 1F95C=peanut
food/bakery: 1F35E=loaf_of_bread/loaves_of_bread 1F950 1F956=baguette 1F968 1F96F 1F95E=stack_of_pancakes/stacks_of_pancakes 1F9C7
    1F369(donut) 1F36A(biscuit) 1F9C1 1F370 1F382 1F967 1F960
food/sweets: 1F36B 1F36C=sweet 1F36D 1F36E=pudding(custard) 1F96E=mooncake 1F366=ice_cream_cone 1F368=sundae
    1F367=bowl_of_shaved_ice/bowls_of_shaved_ice
food/fast food: 1F32D/hot_dogs 1F354(burger) 1F355=pizza_slice(slice_of_pizza/slices_of_pizza) 1F32E 1F32F 1F96A
    1F35F=box_of_fries/boxes_of_fries 1F37F=popcorn_bucket 1F9C6 1F961
food/dish: 1F957=salad_bowl 1F969=steak 1F953=bacon_strip(rasher) 1F357=chicken_leg(drumstick) 1F95A 1F95F 1F363/sushi
    1F359(onigiri/onigiri) 1F358 1F35D=plate_of_spaghetti/plates_of_spaghetti
    1F9C0=cheese_wedge(wedge_of_cheese/wedges_of_cheese) 1FAD3 1FAD4/tamales 1F958=paella 1F371
    1F9C8=block_of_butter/blocks_of_butter 1F96B=tin_can 1F36F
food/drink: 2615=coffee_cup 1F375=teacup 1F377 1F378=cocktail(martini) 1F379 1F37A(tankard) 1F37C 1F37E=champagne_bottle
    1F943=tumbler 1F95B=glass_of_milk/glasses_of_milk 1F964=soda_cup 1F9C3=juice_box 1F9CB 1F9CA
plant/tree: 1F333=tree 1F332=fir_tree(pine_tree) 1F334(palm) 1F384 1F335/cacti 1FAB4(houseplant) 1FAB5=log
plant/flower: 1F337 1F338 1F339 1F33A 1F33B 1F33C 1FAB7 1F490
plant/leaf: 2618 1F340=four-leaf_clover(clover) 1F341=maple_leaf/maple_leaves 1F33F 1F331(sprout)
vehicle/car: 1F697=car(automobile)< 1F695(cab)< 1F693< 1F3CE(race_car)< 1F699=camper_van(motorhome)< 1F6FB(pickup)<
    1F6FA=rickshaw(tuk-tuk)<
vehicle/truck: 1F68C< 1F68E< 1F690< 1F691< 1F692(fire_truck)< 1F69A(delivery_van)< 1F69B=lorry(articulated_lorry)< 1F69C<
vehicle/rail: 1F682< 1F683=railway_carriage(railcar) 1F684< 1F685=bullet_train< 1F686 1F68A(streetcar) 1F69D< 1F6A1=cable_car
vehicle/cycle: 1F6B2(bike)> 1F6F4=kick_scooter< 1F6F5(moped)< 1F3CD=motorcycle(motorbike)<
vehicle/aircraft: 2708(aeroplane)> 1F6E9=propeller_plane> 1F681< 1F680> 1F6F8(ufo) 1F6F0
vehicle/boat: 1F6A2< 26F4< 26F5< 1F6A4< 1F6E5< 1F6F3=cruise_ship< 1F6F6
building/house: 1F3E0=house(home) 1F3E1=cottage 1F6D6 26FA 1F3AA 1F3EF=pagoda
building/public: 1F3E2 1F3E4=post_office 1F3E5 1F3E6 1F3E8 1F3EA 1F3EB(schoolhouse) 1F3EC 1F3ED 1F3DF
building/worship: 26EA 1F54C 1F54D 1F6D5=temple 26E9=shrine 1F3F0=castle
building/street: 1F6A6=traffic_light 1F6A7=roadblock 1F68F 26FD=petrol_pump(gas_pump) 1F6D1=stop_sign 1F4EE(pillar_box) 1F4EB=mailbox
    1F3E7=cash_machine 26F2 1F488
building/fairground: 1F3A1 1F3A2 1F3D7=construction_crane 1F6DD=slide 1F3A0<
nature/landscape: 26F0 1F30B/volcanoes 1F3DD=island 1FAA8 1F3D4=snowy_mountain
nature/sky: 2601 1F308 2600=sun 1F319=moon 1FA90=planet 2604=comet
tool/hand tool: 1F527(spanner) 1F528 1FA93 1FA9A=saw 1FA9B 26CF=pickaxe 1F529=nut_and_bolt/nuts_and_bolts 1F5DC=clamp 1FA9C 1FA9D
    1F9F0 1FAA0 1FAA3(pail)
tool/stationery: 270F 1F58A=pen(ballpoint) 1F58B=fountain_pen 1F58C=paintbrush 1F58D=crayon 1F4CF=ruler 1F4D0=set_square 1F4CE
    1F4CC=pushpin(thumbtack) 2702=pair_of_scissors/pairs_of_scissors
tool/paper: 1F4D3 1F4CB 1F4C1=folder 1F4C5 1F4DC 2709 1F4E6=parcel(package) 1F4F0 1F4D6=book 1F4DA=stack_of_books/stacks_of_books
    1F516 1F3F7=tag(label) 1F9FE
tool/lab: 1F52C 1F52D 1F9EA 1F9EB 1F489 1F48A=capsule(pill) 1FA7A 1FA79=plaster(bandage) 1F321 1F9F2 1F9ED 1F9EE
    1F50D=magnifying_glass 1F9EF
tool/electric: 1F526=flashlight(torch) 1F50B 1F50C=plug 1F4A1=light_bulb(bulb) 1F4E1=satellite_dish 1F4E2=loudspeaker 1F4E3=megaphone
    1F6E2=oil_drum(barrel)
tool/sewing: 1FAA1=needle 1F9F7 1F9F5=spool(cotton_reel) 1F9F6=ball_of_yarn/balls_of_yarn
tool/metal: 1F511 1F512(padlock) 1F514 1F6CE=service_bell 2693 2699=gear(cog) 1F6E1
household/furniture: 1F6CB=sofa(couch) 1F6CF 1FA91 1F6AA 1FA9F 1FA9E 1F6BD 1F6BF 1F6C1(bath) 1F5C4=filing_cabinet
    1F5BC=framed_picture(painting)
household/kitchen: 1F373=frying_pan(skillet) 1FAD6 1F944 1F9C2 1FAD9 1F3FA 1F963=bowl 1FAD5=fondue_pot
household/cleaning: 1F9F9 1F9FA 1F5D1(waste_bin) 1F9FB=toilet_roll 1F9FC=bar_of_soap/bars_of_soap 1F9FD 1F9F4 1FAA5 1FA92
household/electronics: 260E=telephone(phone) 1F4F1(smartphone) 1F4BB=laptop 1F5A5=computer 1F5A8 1F5B1=computer_mouse/computer_mice
    1F4FA(television_set) 1F4FB 1F4F7 1F4F9(camcorder)< 1F3A5< 1F4FD=projector> 1F4E0 1F4DF 1F579
    1F3AE=game_controller(gamepad) 1F4BE 1F4BF=cd(compact_disc) 1F4FC=videotape
household/timekeeping: 1F570=clock 23F0 231A=wristwatch 23F3=hourglass 23F1 1F56F 1FA94=oil_lamp 1F3EE=paper_lantern(lantern)
household/valuables: 1F4B0 1F4B3(bank_card) 1F4B5=banknote(dollar_bill) 1FA99 1F48E=gem(gemstone|jewel) 1F48D 1F52E
household/bag: 1F45B 1F45C 1F392=backpack(rucksack) 1F4BC 1F9F3=suitcase
household/party: 1F381=gift(present) 1F380 1F388 1F383=jack-o-lantern 1F9E8 1F390 1FAA9=disco_ball 1F389=party_popper
household/toy: 1F9F8 1FA80=yoyo 1FA81 1FA86=nesting_doll(matryoshka) 1FA85=pinata 1F3B2=die/dice 1F9E9=puzzle_piece(jigsaw_piece)
    1F3B1=pool_ball(billiard_ball) 2603/snowmen 1FA84=wand 1FA83 1F3B0
household/misc: 1FAA6=gravestone(tombstone) 26B0 26B1=urn 1F6DF=lifebuoy 1F6DE 1F6D2=shopping_cart(shopping_trolley)<
    1F9BD=wheelchair< 1FA7C 1FAA7 1F5FA=map 1F30D=globe
clothing/hat: 1F3A9=top_hat 1F452=sun_hat 1F393=mortarboard(graduation_cap) 1F9E2=baseball_cap 1FA96=helmet 1F451
clothing/shoe: 1F45E=shoe> 1F45F=sneaker(trainer|running_shoe)> 1F460=high_heel> 1F461=sandal> 1F462=boot> 1F97E> 1F97F=flat_shoe>
    1FA70=pair_of_ballet_shoes/pairs_of_ballet_shoes 1FA74=flip-flop
clothing/garment: 1F454=tie(necktie) 1F455 1F456=pair_of_jeans/pairs_of_jeans 1F457 1F458 1F459 1F45A=blouse 1F9E3/scarves
    1F9E4=pair_of_gloves/pairs_of_gloves 1F9E5 1F9E6=pair_of_socks/pairs_of_socks 1F97C 1F9BA 1FA71=swimsuit
    1FA73=pair_of_shorts/pairs_of_shorts 1F97B
clothing/accessory: 1F453=pair_of_glasses/pairs_of_glasses 1F576=pair_of_sunglasses/pairs_of_sunglasses
    1F97D=pair_of_goggles/pairs_of_goggles 1F93F=diving_mask(snorkel_mask) 1F484 1F485=nail_polish/nail_polishes
instrument/instrument: 1F3B7(sax) 1F3B8 1F3B9=keyboard(electric_piano) 1F3BA 1F3BB(fiddle) 1FA95 1FA97 1FA98=conga_drum 1F941=drum
    1F3A4(mic) 1F4EF=post_horn 1F3A7=pair_of_headphones/pairs_of_headphones
sport/ball: 26BD=football(soccer_ball) 26BE 1F3C0=basketball 1F3C8 1F3C9=rugby_ball 1F3D0 1F94E 1F94C 1F94F=frisbee(flying_disc)
sport/gear: 1F3BE=tennis_racket 1F3D3=ping_pong_paddle 1F3F8=badminton_racket 1F94A 1F945=goal 1F3BF=ski_boot 1F3D2=hockey_stick
    1F94D=lacrosse_stick 1F3AF=dartboard 1F3A3=fishing_rod 1F3C6 1F3C5=medal
sport/ride: 26F8> 1F6F9 1F6FC> 1F6F7(sledge)<
"""

# Rule-based cleaning of a Unicode name: qualifiers that never belong to the noun.
_DROP_WORDS = ("BLACK ", "WHITE ", "HEAVY ", "LOWER LEFT ", "WOMANS ", "MANS ")
_DROP_SUFFIX = (" FACE", " SYMBOL")

# Words the caption templates use for sizes, counts, facing and places: a noun form made of one of them, or
# holding a size, count or facing word, would make a caption ambiguous.
RESERVED_WORDS = frozenset("small little large big tiny one two three left right facing left-facing right-facing above below "
                           "over under beneath between next top bottom row column picture image photo scene".split())
_ATTRIBUTE_WORDS = frozenset("small little large big tiny one two three left-facing right-facing facing".split())

_TOKEN = re.compile(r"^(?P<cp>[0-9A-F]{4,5})(?:=(?P<noun>[a-z_\-]+))?(?:/(?P<plural>[a-z_\-]+))?"
                    r"(?:\((?P<syn>[a-z_|/\-]+)\))?(?P<facing>[<>])?$")


@dataclass(frozen=True)
class GlyphRow:
    """One row of the glyph table."""

    codepoint: str
    unicode_name: str
    cleaned: str
    noun: str
    noun_from: str  # "name" (the cleaned name) or "list" (the curated noun)
    plural: str
    category: str
    group: str
    synonyms: tuple[tuple[str, str], ...]  # (singular, plural)
    facing: str  # "left" | "right" | "" (no direction)

    def tsv(self) -> str:
        """The row as a TSV line (synonyms as sing/plural joined by |)."""
        syn = "|".join(f"{s}/{p}" for s, p in self.synonyms)
        return "\t".join((self.codepoint, self.unicode_name, self.cleaned, self.noun, self.noun_from, self.plural,
                          self.category, self.group, syn, self.facing))


def clean_name(name: str) -> str:
    """The noun the rules make of a Unicode name: "DOG FACE" -> "dog", "BLACK SCISSORS" -> "scissors"."""
    for w in _DROP_WORDS:
        if name.startswith(w):
            name = name[len(w):]
    for s in _DROP_SUFFIX:
        if name.endswith(s):
            name = name[: -len(s)]
    return name.lower()


def plural(noun: str) -> str:
    """English plural of a noun phrase: "bunch of grapes" -> "bunches of grapes", "cherry" -> "cherries"."""
    if " of " in noun:
        head, rest = noun.split(" of ", 1)
        return f"{plural(head)} of {rest}"
    words = noun.split(" ")
    last = words[-1]
    if re.search(r"(s|x|z|ch|sh)$", last):
        last += "es"
    elif re.search(r"[^aeiou]y$", last):
        last = last[:-1] + "ies"
    elif last.endswith("knife"):
        last = last[:-2] + "ves"
    else:
        last += "s"
    return " ".join(words[:-1] + [last])


def _words(s: str) -> str:
    return s.replace("_", " ")


def parse_curated(text: str = CURATED) -> list[tuple[str, str, dict]]:
    """(category, group, token fields) for every token of the curated list, in order."""
    out = []
    lines: list[tuple[str, str]] = []  # (head, tokens); indented lines continue the group above
    for line in text.strip().splitlines():
        if line.startswith(" "):
            lines[-1] = (lines[-1][0], lines[-1][1] + " " + line)
        else:
            head, tokens = line.split(":", 1)
            lines.append((head, tokens))
    for head, tokens in lines:
        category, group = head.split("/", 1)
        for tok in tokens.split():
            m = _TOKEN.match(tok)
            if not m:
                raise ValueError(f"bad token {tok!r} in {head!r}")
            out.append((category, group, m.groupdict()))
    return out


def build_table(text: str = CURATED) -> list[GlyphRow]:
    """All rows, checked: known code points, unique nouns and noun forms, no reserved words."""
    rows = []
    for category, group, f in parse_curated(text):
        ch = chr(int(f["cp"], 16))
        name = unicodedata.name(ch)
        cleaned = clean_name(name)
        noun = _words(f["noun"]) if f["noun"] else cleaned
        syns = []
        for s in (f["syn"] or "").split("|"):
            if s:
                sing, _, pl = s.partition("/")
                syns.append((_words(sing), _words(pl) if pl else plural(_words(sing))))
        facing = {"<": "left", ">": "right", None: ""}[f["facing"]]
        rows.append(GlyphRow(f"U+{f['cp']}", name, cleaned, noun, "name" if noun == cleaned else "list",
                             _words(f["plural"]) if f["plural"] else plural(noun), category, group, tuple(syns), facing))
    check_table(rows)
    return rows


def noun_forms(row: GlyphRow) -> list[str]:
    """Every surface form of a row's noun: noun, plural, synonyms and their plurals."""
    return [row.noun, row.plural] + [w for pair in row.synonyms for w in pair]


def check_table(rows: list[GlyphRow]) -> None:
    """Raise when a code point or noun repeats, a noun form names two rows, or a form uses a reserved word."""
    seen_cp: set[str] = set()
    owner: dict[str, str] = {}
    for r in rows:
        if r.codepoint in seen_cp:
            raise ValueError(f"{r.codepoint} listed twice")
        seen_cp.add(r.codepoint)
        for form in set(noun_forms(r)):
            if form in owner and owner[form] != r.noun:
                raise ValueError(f"{form!r} names both {owner[form]!r} and {r.noun!r}")
            owner[form] = r.noun
            words = form.split(" ")
            if form in RESERVED_WORDS or _ATTRIBUTE_WORDS & set(words):
                raise ValueError(f"{form!r} ({r.noun}) uses a reserved caption word")
    groups: dict[str, int] = {}
    for r in rows:
        groups[r.group] = groups.get(r.group, 0) + 1
    lonely = [g for g, n in groups.items() if n < 2]
    if lonely:
        raise ValueError(f"groups with one glyph have no neighbour for noun twins: {lonely}")


def write_table(path: Path = TABLE_PATH) -> Path:
    """Write the TSV (header + one row per glyph) and return its path."""
    rows = build_table()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\t".join(COLUMNS) + "\n" + "".join(r.tsv() + "\n" for r in rows), encoding="utf-8")
    return path
