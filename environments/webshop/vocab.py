"""Vocabulary of the generated WebShop-style catalogue: categories, product types, attributes and options.

Everything here is data. :mod:`environments.webshop.catalogue` draws products and goals from it.

Conventions the catalogue relies on (checked by the tests):

* attribute phrases and option values are lower case;
* no attribute phrase occurs, as whole words, inside another attribute phrase (so a text search for one never
  finds another), and none occurs inside a brand name or the fixed description/feature text;
* within one product type, no option value is used by two option groups, and no option value spells a page
  button (``buy now``, ``description``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BRANDS",
    "CATEGORIES",
    "FILLER_BULLETS",
    "FILLER_SENTENCES",
    "OPTION_PHRASES",
    "PRODUCT_TYPES",
    "ProductType",
]


@dataclass(frozen=True)
class ProductType:
    """One kind of product (e.g. men's/women's t-shirts).

    category: top-level category ("clothing", "shoes", "electronics", "grocery", "home").
    path: category path, most general first; ``{aud}`` is replaced by the audience (e.g. "men's").
    noun: the type's noun phrase as it appears in titles and instructions ("t-shirt", "running shoes").
    number: "singular" (takes "a"/"an" and "is"), "plural" (no article, "are") or "mass" (no article, "is").
    audiences: possible audiences ("men's", "women's"); empty for products without one.
    attribute_groups: each group holds mutually exclusive attribute phrases; a product takes at most one per group.
    options: ``(option name, pool of values)``; a product offers a subset of each pool.
    price: ``(low, high)`` dollars.
    """

    category: str
    path: tuple[str, ...]
    noun: str
    number: str
    audiences: tuple[str, ...]
    attribute_groups: tuple[tuple[str, ...], ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    price: tuple[float, float]


CATEGORIES = ("clothing", "shoes", "electronics", "grocery", "home")

# How an option is written in an instruction ("{v}" is the value).
OPTION_PHRASES = {
    "color": "in {v}",
    "size": "in size {v}",
    "flavor": "in {v} flavor",
    "scent": "with {v} scent",
    "model": "for {v}",
    "length": "{v} long",
    "pack": "{v}",
    "wattage": "rated {v}",
    "capacity": "with {v} capacity",
}

_WEAR_SIZES = ("x-small", "small", "medium", "large", "x-large", "xx-large")
_WEAR_COLORS = (
    "black",
    "white",
    "navy",
    "heather gray",
    "red",
    "olive green",
    "royal blue",
    "burgundy",
    "beige",
    "pink",
)
_JEAN_SIZES = ("28w x 30l", "30w x 30l", "32w x 32l", "34w x 32l", "36w x 34l", "38w x 34l")
_JEAN_COLORS = ("light wash", "medium wash", "dark wash", "black", "gray")
_SHOE_SIZES = ("6", "6.5", "7", "7.5", "8", "8.5", "9", "9.5", "10", "10.5", "11", "12")
_SHOE_COLORS = ("black", "white", "brown", "gray", "navy", "tan", "red", "pink", "olive")
_TECH_COLORS = ("black", "white", "blue", "gray", "pink", "green", "purple")
_PHONES = ("iphone 14", "iphone 15", "iphone 15 pro", "galaxy s23", "galaxy s24", "pixel 8")
_HOME_COLORS = ("white", "gray", "navy", "beige", "sage green", "charcoal", "ivory", "blush pink")
_BED_SIZES = ("twin", "full", "queen", "king", "california king")

_W = ("men's", "women's")

PRODUCT_TYPES: tuple[ProductType, ...] = (
    # ------------------------------------------------------------------ clothing
    ProductType(
        "clothing",
        ("clothing", "{aud} clothing", "shirts"),
        "t-shirt",
        "singular",
        _W,
        (
            ("long sleeve", "short sleeve"),
            ("cotton", "polyester blend"),
            ("machine wash", "hand wash"),
            ("slim fit", "relaxed fit", "classic fit"),
            ("crew neck", "v-neck"),
            ("moisture wicking",),
        ),
        (("size", _WEAR_SIZES), ("color", _WEAR_COLORS)),
        (9.0, 35.0),
    ),
    ProductType(
        "clothing",
        ("clothing", "{aud} clothing", "sweatshirts"),
        "hoodie",
        "singular",
        _W,
        (
            ("pullover", "zip up"),
            ("fleece lined",),
            ("machine wash", "hand wash"),
            ("cotton", "polyester blend"),
            ("kangaroo pocket",),
            ("drawstring closure",),
        ),
        (("size", _WEAR_SIZES), ("color", _WEAR_COLORS)),
        (20.0, 60.0),
    ),
    ProductType(
        "clothing",
        ("clothing", "{aud} clothing", "pants"),
        "jeans",
        "plural",
        _W,
        (
            ("slim fit", "relaxed fit", "straight leg", "bootcut"),
            ("stretch denim",),
            ("machine wash",),
            ("button closure", "zipper closure"),
            ("high waist", "mid rise"),
        ),
        (("size", _JEAN_SIZES), ("color", _JEAN_COLORS)),
        (25.0, 80.0),
    ),
    ProductType(
        "clothing",
        ("clothing", "{aud} clothing", "dresses"),
        "dress",
        "singular",
        ("women's",),
        (
            ("sleeveless", "short sleeve", "long sleeve"),
            ("machine wash", "hand wash"),
            ("knee length", "maxi length", "mini length"),
            ("floral print", "solid color", "polka dot"),
            ("v-neck", "crew neck"),
            ("with pockets",),
        ),
        (("size", _WEAR_SIZES), ("color", _WEAR_COLORS)),
        (22.0, 75.0),
    ),
    ProductType(
        "clothing",
        ("clothing", "{aud} clothing", "shorts"),
        "athletic shorts",
        "plural",
        _W,
        (
            ("quick dry",),
            ("elastic waistband",),
            ("with pockets",),
            ("machine wash",),
            ("5 inch inseam", "7 inch inseam", "9 inch inseam"),
            ("moisture wicking",),
        ),
        (("size", _WEAR_SIZES), ("color", _WEAR_COLORS)),
        (12.0, 40.0),
    ),
    ProductType(
        "clothing",
        ("clothing", "{aud} clothing", "coats"),
        "rain jacket",
        "singular",
        _W,
        (
            ("waterproof", "water resistant"),
            ("packable",),
            ("hooded",),
            ("zipper closure", "snap closure"),
            ("lightweight",),
            ("machine wash",),
        ),
        (("size", _WEAR_SIZES), ("color", _WEAR_COLORS)),
        (35.0, 120.0),
    ),
    ProductType(
        "clothing",
        ("clothing", "{aud} clothing", "socks"),
        "crew socks",
        "plural",
        _W,
        (
            ("cushioned",),
            ("moisture wicking",),
            ("cotton", "merino wool"),
            ("arch support",),
            ("machine wash",),
        ),
        (("size", ("small", "medium", "large")), ("pack", ("3 pairs", "6 pairs", "12 pairs"))),
        (8.0, 30.0),
    ),
    ProductType(
        "clothing",
        ("clothing", "{aud} clothing", "activewear"),
        "leggings",
        "plural",
        ("women's",),
        (
            ("high waist", "mid rise"),
            ("squat proof",),
            ("four way stretch",),
            ("with pockets",),
            ("tummy control",),
            ("machine wash",),
        ),
        (("size", _WEAR_SIZES), ("color", _WEAR_COLORS)),
        (15.0, 50.0),
    ),
    ProductType(
        "clothing",
        ("clothing", "{aud} clothing", "shirts"),
        "polo shirt",
        "singular",
        ("men's",),
        (
            ("short sleeve", "long sleeve"),
            ("cotton", "polyester blend"),
            ("slim fit", "classic fit"),
            ("button closure",),
            ("machine wash",),
        ),
        (("size", _WEAR_SIZES), ("color", _WEAR_COLORS)),
        (15.0, 45.0),
    ),
    ProductType(
        "clothing",
        ("clothing", "{aud} clothing", "sleepwear"),
        "pajama set",
        "singular",
        _W,
        (
            ("long sleeve", "short sleeve"),
            ("soft fabric",),
            ("button closure",),
            ("elastic waistband",),
            ("machine wash", "hand wash"),
        ),
        (("size", _WEAR_SIZES), ("color", _WEAR_COLORS)),
        (18.0, 55.0),
    ),
    # ------------------------------------------------------------------ shoes
    ProductType(
        "shoes",
        ("shoes", "{aud} shoes", "athletic"),
        "running shoes",
        "plural",
        _W,
        (
            ("lightweight",),
            ("breathable mesh",),
            ("rubber sole",),
            ("non-slip",),
            ("memory foam insole",),
            ("lace up", "slip on"),
        ),
        (("size", _SHOE_SIZES), ("color", _SHOE_COLORS)),
        (30.0, 130.0),
    ),
    ProductType(
        "shoes",
        ("shoes", "{aud} shoes", "boots"),
        "ankle boots",
        "plural",
        _W,
        (
            ("high heel", "low heel", "flat heel"),
            ("faux leather", "genuine leather", "suede"),
            ("side zipper", "lace up"),
            ("waterproof",),
            ("rubber sole",),
            ("pointed toe", "round toe"),
        ),
        (("size", _SHOE_SIZES), ("color", _SHOE_COLORS)),
        (35.0, 150.0),
    ),
    ProductType(
        "shoes",
        ("shoes", "{aud} shoes", "boots"),
        "rain boots",
        "plural",
        _W,
        (
            ("waterproof",),
            ("rubber sole",),
            ("non-slip",),
            ("knee high", "mid calf"),
            ("pull on",),
        ),
        (("size", _SHOE_SIZES), ("color", _SHOE_COLORS)),
        (25.0, 90.0),
    ),
    ProductType(
        "shoes",
        ("shoes", "{aud} shoes", "sandals"),
        "slide sandals",
        "plural",
        _W,
        (
            ("arch support",),
            ("quick dry",),
            ("non-slip",),
            ("open toe",),
            ("memory foam insole",),
        ),
        (("size", _SHOE_SIZES), ("color", _SHOE_COLORS)),
        (12.0, 60.0),
    ),
    ProductType(
        "shoes",
        ("shoes", "{aud} shoes", "slippers"),
        "house slippers",
        "plural",
        _W,
        (
            ("memory foam insole",),
            ("faux fur lined", "fleece lined"),
            ("non-slip",),
            ("machine wash",),
            ("closed toe", "open toe"),
        ),
        (("size", _SHOE_SIZES), ("color", _SHOE_COLORS)),
        (10.0, 45.0),
    ),
    ProductType(
        "shoes",
        ("shoes", "{aud} shoes", "dress shoes"),
        "loafers",
        "plural",
        _W,
        (
            ("genuine leather", "faux leather", "suede"),
            ("slip on",),
            ("rubber sole",),
            ("round toe", "square toe"),
            ("cushioned",),
        ),
        (("size", _SHOE_SIZES), ("color", _SHOE_COLORS)),
        (35.0, 140.0),
    ),
    ProductType(
        "shoes",
        ("shoes", "{aud} shoes", "dress shoes"),
        "pumps",
        "plural",
        ("women's",),
        (
            ("high heel", "low heel"),
            ("pointed toe", "round toe"),
            ("faux leather", "suede"),
            ("slip on",),
            ("cushioned",),
        ),
        (("size", _SHOE_SIZES), ("color", _SHOE_COLORS)),
        (30.0, 110.0),
    ),
    ProductType(
        "shoes",
        ("shoes", "{aud} shoes", "athletic"),
        "canvas sneakers",
        "plural",
        _W,
        (
            ("lace up", "slip on"),
            ("rubber sole",),
            ("lightweight",),
            ("breathable mesh",),
            ("low top", "high top"),
        ),
        (("size", _SHOE_SIZES), ("color", _SHOE_COLORS)),
        (20.0, 75.0),
    ),
    # ------------------------------------------------------------------ electronics accessories
    ProductType(
        "electronics",
        ("electronics", "cell phone accessories", "cases"),
        "phone case",
        "singular",
        (),
        (
            ("shockproof",),
            ("slim profile",),
            ("magsafe compatible",),
            ("clear back", "matte finish"),
            ("raised edges",),
            ("kickstand",),
        ),
        (("model", _PHONES), ("color", _TECH_COLORS)),
        (8.0, 40.0),
    ),
    ProductType(
        "electronics",
        ("electronics", "cell phone accessories", "cables"),
        "charging cable",
        "singular",
        (),
        (
            ("fast charging",),
            ("braided nylon",),
            ("usb-c to usb-c", "usb-c to lightning", "usb-a to usb-c"),
            ("data sync",),
            ("tangle free",),
        ),
        (("length", ("3 ft", "6 ft", "10 ft")), ("color", _TECH_COLORS), ("pack", ("1 pack", "2 pack", "3 pack"))),
        (6.0, 25.0),
    ),
    ProductType(
        "electronics",
        ("electronics", "cell phone accessories", "chargers"),
        "wall charger",
        "singular",
        (),
        (
            ("fast charging",),
            ("dual port", "single port", "triple port"),
            ("foldable plug",),
            ("compact design",),
            ("gan technology",),
        ),
        (("wattage", ("20w", "30w", "45w", "65w")), ("color", _TECH_COLORS)),
        (10.0, 50.0),
    ),
    ProductType(
        "electronics",
        ("electronics", "audio", "headphones"),
        "wireless earbuds",
        "plural",
        (),
        (
            ("noise cancelling",),
            ("bluetooth 5.3",),
            ("water resistant", "waterproof"),
            ("long battery life",),
            ("charging case",),
            ("built-in microphone",),
        ),
        (("color", _TECH_COLORS),),
        (20.0, 150.0),
    ),
    ProductType(
        "electronics",
        ("electronics", "cell phone accessories", "batteries"),
        "power bank",
        "singular",
        (),
        (
            ("fast charging",),
            ("compact design",),
            ("led display",),
            ("usb-c port",),
            ("airline approved",),
        ),
        (("capacity", ("5000mah", "10000mah", "20000mah", "26800mah")), ("color", _TECH_COLORS)),
        (15.0, 70.0),
    ),
    ProductType(
        "electronics",
        ("electronics", "cell phone accessories", "screen protectors"),
        "screen protector",
        "singular",
        (),
        (
            ("tempered glass",),
            ("bubble free",),
            ("easy installation",),
            ("case friendly",),
            ("privacy filter",),
        ),
        (("model", _PHONES), ("pack", ("1 pack", "2 pack", "3 pack"))),
        (6.0, 25.0),
    ),
    ProductType(
        "electronics",
        ("electronics", "computer accessories", "bags"),
        "laptop sleeve",
        "singular",
        (),
        (
            ("water resistant",),
            ("padded",),
            ("zipper closure",),
            ("slim profile",),
            ("with handle",),
        ),
        (("size", ("13 inch", "14 inch", "15.6 inch", "16 inch")), ("color", _TECH_COLORS)),
        (12.0, 45.0),
    ),
    ProductType(
        "electronics",
        ("electronics", "computer accessories", "cables"),
        "hdmi cable",
        "singular",
        (),
        (
            ("4k",),
            ("high speed",),
            ("braided nylon",),
            ("gold plated",),
        ),
        (("length", ("3 ft", "6 ft", "10 ft", "15 ft")), ("pack", ("1 pack", "2 pack"))),
        (7.0, 30.0),
    ),
    ProductType(
        "electronics",
        ("electronics", "computer accessories", "mice"),
        "wireless mouse",
        "singular",
        (),
        (
            ("ergonomic design",),
            ("silent click",),
            ("rechargeable",),
            ("bluetooth 5.3",),
            ("adjustable dpi",),
        ),
        (("color", _TECH_COLORS),),
        (10.0, 60.0),
    ),
    ProductType(
        "electronics",
        ("electronics", "computer accessories", "keyboards"),
        "bluetooth keyboard",
        "singular",
        (),
        (
            ("rechargeable",),
            ("backlit keys",),
            ("compact design",),
            ("multi device",),
            ("quiet typing",),
        ),
        (("color", _TECH_COLORS),),
        (20.0, 90.0),
    ),
    # ------------------------------------------------------------------ grocery
    ProductType(
        "grocery",
        ("grocery", "snacks", "bars"),
        "protein bars",
        "plural",
        (),
        (
            ("gluten free",),
            ("high protein",),
            ("low sugar",),
            ("non gmo",),
            ("keto friendly",),
        ),
        (
            ("flavor", ("chocolate chip", "peanut butter", "cookies and cream", "salted caramel", "birthday cake")),
            ("pack", ("12 count", "24 count")),
        ),
        (15.0, 45.0),
    ),
    ProductType(
        "grocery",
        ("grocery", "snacks", "chips"),
        "potato chips",
        "plural",
        (),
        (
            ("gluten free",),
            ("non gmo",),
            ("kettle cooked",),
            ("low sodium",),
            ("vegan",),
        ),
        (
            ("flavor", ("sea salt", "sour cream and onion", "barbecue", "salt and vinegar", "jalapeno")),
            ("pack", ("pack of 12", "pack of 24", "pack of 36")),
        ),
        (10.0, 35.0),
    ),
    ProductType(
        "grocery",
        ("grocery", "beverages", "coffee"),
        "coffee beans",
        "plural",
        (),
        (
            ("whole bean", "ground"),
            ("organic",),
            ("fair trade",),
            ("light roast", "medium roast", "dark roast"),
            ("single origin",),
        ),
        (("size", ("12 ounce", "2 pound", "5 pound")),),
        (9.0, 60.0),
    ),
    ProductType(
        "grocery",
        ("grocery", "beverages", "tea"),
        "herbal tea",
        "mass",
        (),
        (
            ("caffeine free",),
            ("organic",),
            ("non gmo",),
            ("individually wrapped",),
            ("kosher",),
        ),
        (("flavor", ("chamomile", "peppermint", "ginger", "lemon", "hibiscus")), ("pack", ("20 count", "40 count"))),
        (5.0, 25.0),
    ),
    ProductType(
        "grocery",
        ("grocery", "pantry", "oils"),
        "olive oil",
        "mass",
        (),
        (
            ("extra virgin",),
            ("cold pressed",),
            ("organic",),
            ("non gmo",),
            ("glass bottle",),
        ),
        (("size", ("16.9 fl oz", "33.8 fl oz", "50.7 fl oz")),),
        (8.0, 40.0),
    ),
    ProductType(
        "grocery",
        ("grocery", "snacks", "cookies"),
        "sandwich cookies",
        "plural",
        (),
        (
            ("gluten free",),
            ("vegan",),
            ("individually wrapped",),
            ("no artificial flavors",),
            ("kosher",),
        ),
        (("flavor", ("vanilla creme", "chocolate", "lemon", "mint")), ("pack", ("pack of 6", "pack of 12"))),
        (6.0, 30.0),
    ),
    ProductType(
        "grocery",
        ("grocery", "snacks", "jerky"),
        "beef jerky",
        "mass",
        (),
        (
            ("high protein",),
            ("gluten free",),
            ("low sugar",),
            ("grass fed",),
            ("no preservatives",),
        ),
        (("flavor", ("original", "teriyaki", "peppered", "sweet and spicy")), ("size", ("3 ounce", "10 ounce"))),
        (8.0, 40.0),
    ),
    ProductType(
        "grocery",
        ("grocery", "pantry", "pasta"),
        "pasta",
        "mass",
        (),
        (
            ("gluten free",),
            ("organic",),
            ("whole wheat",),
            ("non gmo",),
            ("high protein",),
        ),
        (("size", ("8 ounce", "12 ounce", "16 ounce")), ("pack", ("pack of 4", "pack of 6", "pack of 8"))),
        (6.0, 30.0),
    ),
    # ------------------------------------------------------------------ home
    ProductType(
        "home",
        ("home", "bedding", "sheets"),
        "bed sheet set",
        "singular",
        (),
        (
            ("deep pocket",),
            ("wrinkle free",),
            ("machine wash",),
            ("cotton", "microfiber", "bamboo viscose"),
            ("cooling",),
        ),
        (("size", _BED_SIZES), ("color", _HOME_COLORS)),
        (20.0, 90.0),
    ),
    ProductType(
        "home",
        ("home", "decor", "pillows"),
        "throw pillow cover",
        "singular",
        (),
        (
            ("zipper closure",),
            ("double sided",),
            ("machine wash",),
            ("linen blend", "velvet"),
            ("decorative",),
        ),
        (("size", ("16 x 16 inch", "18 x 18 inch", "20 x 20 inch")), ("color", _HOME_COLORS)),
        (8.0, 30.0),
    ),
    ProductType(
        "home",
        ("home", "bath", "curtains"),
        "shower curtain",
        "singular",
        (),
        (
            ("waterproof",),
            ("machine wash",),
            ("mildew resistant",),
            ("with hooks",),
            ("heavy duty",),
        ),
        (("size", ("72 x 72 inch", "72 x 84 inch")), ("color", _HOME_COLORS)),
        (10.0, 40.0),
    ),
    ProductType(
        "home",
        ("home", "kitchen", "cookware"),
        "frying pan",
        "singular",
        (),
        (
            ("non-stick",),
            ("dishwasher safe",),
            ("oven safe",),
            ("induction compatible",),
            ("pfoa free",),
        ),
        (("size", ("8 inch", "10 inch", "12 inch")),),
        (15.0, 80.0),
    ),
    ProductType(
        "home",
        ("home", "lighting", "lamps"),
        "desk lamp",
        "singular",
        (),
        (
            ("dimmable",),
            ("usb charging port",),
            ("touch control",),
            ("eye caring",),
            ("adjustable arm",),
        ),
        (("color", ("black", "white", "silver", "gold")),),
        (15.0, 70.0),
    ),
    ProductType(
        "home",
        ("home", "decor", "candles"),
        "scented candle",
        "singular",
        (),
        (
            ("soy wax",),
            ("long lasting",),
            ("lead free wick",),
            ("glass jar",),
            ("hand poured",),
        ),
        (("scent", ("lavender", "vanilla", "eucalyptus", "fresh linen", "sandalwood")),),
        (8.0, 35.0),
    ),
    ProductType(
        "home",
        ("home", "bath", "towels"),
        "bath towel set",
        "singular",
        (),
        (
            ("quick dry",),
            ("highly absorbent",),
            ("cotton", "microfiber"),
            ("machine wash",),
            ("hotel quality",),
        ),
        (("color", _HOME_COLORS), ("pack", ("2 piece", "4 piece", "6 piece"))),
        (18.0, 65.0),
    ),
    ProductType(
        "home",
        ("home", "kitchen", "storage"),
        "food storage containers",
        "plural",
        (),
        (
            ("bpa free",),
            ("airtight lids",),
            ("dishwasher safe",),
            ("microwave safe",),
            ("stackable",),
        ),
        (("pack", ("10 piece", "24 piece", "36 piece")), ("color", ("clear", "gray", "blue"))),
        (12.0, 45.0),
    ),
)

BRANDS = {
    "clothing": ("Northpeak", "Urbanloom", "Brightfold", "Larkspur", "Tidewell", "Mossgrove", "Quillon", "Harrowby"),
    "shoes": ("Stridemark", "Pavona", "Corvel", "Trailwick", "Aldane", "Fennick", "Rowanby", "Solvara"),
    "electronics": ("Voltiq", "Nexbridge", "Ampora", "Circuva", "Lumatek", "Zentrix", "Ohmline", "Pixelon"),
    "grocery": ("Harvestly", "Goldmeadow", "Pantrio", "Orchardine", "Kettlebrook", "Nutrava", "Sunwick", "Grainery"),
    "home": ("Hearthly", "Linenora", "Casavela", "Dwellmore", "Nestora", "Brightmere", "Homevale", "Kindlewood"),
}

# Fixed text used in descriptions and feature bullets; must not contain any attribute phrase.
FILLER_SENTENCES = {
    "clothing": (
        "Please check the size chart before ordering.",
        "A versatile piece for work, travel and weekends.",
        "Colors may vary slightly from the photos.",
    ),
    "shoes": (
        "Please check the size chart before ordering.",
        "A dependable pair for errands, travel and long days.",
        "Colors may vary slightly from the photos.",
    ),
    "electronics": (
        "Compatible devices are listed in the product options.",
        "Backed by a one year limited warranty.",
        "Ships in recyclable packaging.",
    ),
    "grocery": (
        "Store in a cool, dry place.",
        "Made in a facility that also processes tree nuts.",
        "Great for the pantry, the office or on the go.",
    ),
    "home": (
        "Makes a thoughtful housewarming gift.",
        "Designed to fit a wide range of home styles.",
        "Ships in recyclable packaging.",
    ),
}
FILLER_BULLETS = (
    "CUSTOMER CARE - contact us with any question about your order",
    "QUALITY CHECKED - every unit is inspected before shipping",
    "GIFT READY - arrives in a neat retail box",
)
