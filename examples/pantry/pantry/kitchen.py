"""A pantry kept as plain Python objects: an example of an object environment (see docs/objects.md).

Nothing here knows about synthloop: ``make_pantry(seed)`` returns the instances, their public methods are the
tools and their public attributes the state.
"""

import random


class Shelf:
    def __init__(self, name):
        self.name = name
        self.jars = {}  # label -> grams


class Pantry:
    """Shelves of jars, a shopping list and the cook's favourite labels."""

    def __init__(self, seed=0):
        rng = random.Random(seed)
        self.owner = rng.choice(["ada", "grace", "linus"])
        self.shelves = {"top": Shelf("top"), "bottom": Shelf("bottom")}
        for label in rng.sample(["rice", "oats", "lentils", "flour", "sugar"], 4):
            self.shelves[rng.choice(["top", "bottom"])].jars[label] = rng.randrange(100, 1000, 50)
        self.shopping = []
        self.favourites = {"oats"}
        self._log = []  # private: not state, not a tool

    def find_jar(self, jar: str) -> dict:
        """Find which shelf holds a jar.

        Args:
            jar: The jar's label, e.g. "rice".
        """
        for shelf in self.shelves.values():
            if jar in shelf.jars:
                return {"shelf": shelf.name, "grams": shelf.jars[jar]}
        raise KeyError(f"no jar labelled {jar}")

    def use(self, jar: str, grams: int = 50) -> dict:
        """Take some grams out of a jar; an empty jar goes onto the shopping list.

        Args:
            jar: The jar's label.
            grams: How much to take.
        """
        where = self.find_jar(jar)
        if grams > where["grams"]:
            raise ValueError(f"only {where['grams']} g of {jar} left")
        shelf = self.shelves[where["shelf"]]
        shelf.jars[jar] -= grams
        self._log.append(("use", jar, grams))
        if shelf.jars[jar] == 0:
            del shelf.jars[jar]
            self.shopping.append(jar)
        return {"left": shelf.jars.get(jar, 0)}

    def add_to_list(self, item: str) -> list:
        """Put an item on the shopping list.

        Args:
            item: What to buy.
        """
        self.shopping.append(item)
        return list(self.shopping)

    def like(self, label):
        """Mark a label as a favourite (no annotation: the parameter takes anything)."""
        self.favourites.add(label)
        return sorted(self.favourites)


def make_pantry(seed):
    """The factory synthloop calls: seed -> the environment's instances."""
    return Pantry(seed)
