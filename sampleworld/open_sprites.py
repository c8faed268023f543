"""The open world's sprite sheet: every glyph of the table rendered once from Noto Color Emoji.

The sheet (open_assets/sprites.png, RGBA, CELL x CELL per glyph, in table order, COLUMNS per row) is committed
with the font's licence beside it, so generating an open world needs neither the font nor a font renderer;
only ``build-sprites`` (run once, by whoever changes the table) needs ``fonts-noto-color-emoji``.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from .open_table import ASSETS

SHEET_PATH = ASSETS / "sprites.png"
FONT_PATH = Path("/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf")
FONT_PACKAGE = "fonts-noto-color-emoji"
FONT_SIZE = 109  # the only size Noto Color Emoji's bitmap strike comes in
CELL = 72
COLUMNS = 24
_MARGIN = 1  # transparent pixels kept around each glyph so resampling never clips its edge


def render_glyph(font: ImageFont.FreeTypeFont, ch: str, cell: int = CELL) -> Image.Image:
    """One glyph, cropped to its opaque pixels and scaled to fit a ``cell`` square (centred, RGBA)."""
    canvas = Image.new("RGBA", (192, 160), (0, 0, 0, 0))
    ImageDraw.Draw(canvas).text((8, 8), ch, font=font, embedded_color=True)
    box = canvas.getchannel("A").getbbox()
    if box is None:
        raise ValueError(f"U+{ord(ch):04X} draws nothing in this font")
    glyph = canvas.crop(box)
    inner = cell - 2 * _MARGIN
    scale = inner / max(glyph.size)
    size = (max(1, round(glyph.size[0] * scale)), max(1, round(glyph.size[1] * scale)))
    # Resample premultiplied so transparent pixels' colours do not bleed into the edges.
    glyph = glyph.convert("RGBa").resize(size, Image.Resampling.LANCZOS).convert("RGBA")
    out = Image.new("RGBA", (cell, cell), (0, 0, 0, 0))
    out.paste(glyph, ((cell - size[0]) // 2, (cell - size[1]) // 2))
    return out


def build_sheet(codepoints: list[str], font_path: Path = FONT_PATH, out: Path = SHEET_PATH, cell: int = CELL) -> Path:
    """Render ``codepoints`` ("U+1F415", ...) into the sheet; a clear error names the Debian package when the font is missing."""
    if not Path(font_path).exists():
        raise FileNotFoundError(f"{font_path} not found: install the font with `apt-get install -y {FONT_PACKAGE}` "
                                "(only needed to rebuild the committed sprite sheet)")
    font = ImageFont.truetype(str(font_path), FONT_SIZE)
    rows = -(-len(codepoints) // COLUMNS)
    sheet = Image.new("RGBA", (COLUMNS * cell, rows * cell), (0, 0, 0, 0))
    for i, cp in enumerate(codepoints):
        tile = render_glyph(font, chr(int(cp[2:], 16)), cell)
        sheet.paste(tile, ((i % COLUMNS) * cell, (i // COLUMNS) * cell))
    out.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(out, format="PNG", optimize=True)
    return out


@functools.lru_cache(maxsize=1)
def load_sheet(path: Path = SHEET_PATH) -> np.ndarray:
    """The committed sheet as uint8 [rows*CELL, COLUMNS*CELL, 4]."""
    with Image.open(path) as im:
        return np.asarray(im.convert("RGBA"))


def sprite(index: int, path: Path = SHEET_PATH) -> np.ndarray:
    """The CELL x CELL RGBA sprite of table row ``index`` (a view into the sheet)."""
    sheet = load_sheet(path)
    r, c = divmod(index, COLUMNS)
    tile = sheet[r * CELL:(r + 1) * CELL, c * CELL:(c + 1) * CELL]
    if tile.shape[:2] != (CELL, CELL):
        raise IndexError(f"sprite {index} lies outside {path}")
    return tile
