"""The demo world's vocabulary: six shape classes and eight attributes (six colours, two sizes).

The order of CLASS_NAMES and ATTRIBUTE_NAMES is the detector's class and attribute index order.
"""

CLASS_NAMES = ("square", "circle", "triangle", "diamond", "star", "cross")
PLURALS = {"square": "squares", "circle": "circles", "triangle": "triangles", "diamond": "diamonds",
           "star": "stars", "cross": "crosses"}

# Saturated colours, far from the muted backgrounds and from each other.
COLOURS = {
    "red": (215, 35, 35),
    "green": (40, 165, 55),
    "blue": (35, 80, 225),
    "yellow": (240, 215, 30),
    "purple": (145, 55, 195),
    "orange": (250, 130, 15),
}

# Side length in pixels of the square each shape is drawn in. Medium objects carry no size
# attribute, so sizes are only named where they are unambiguous.
SIZE_EXTENTS = {"small": (14, 20), "medium": (26, 34), "large": (42, 54)}
NAMED_SIZES = ("small", "large")

ATTRIBUTE_NAMES = tuple(COLOURS) + NAMED_SIZES

BACKGROUNDS = ("noise", "stripes", "checks", "gradient")

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
