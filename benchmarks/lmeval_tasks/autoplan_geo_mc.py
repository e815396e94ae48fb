"""200 questions "<subdivision> is a <type> of" -> 4 countries, from pycountry (seed 0)."""

import random


def load(**_kwargs):  # noqa: ANN003, ANN201 - lm-eval's custom_dataset signature
    import datasets
    import pycountry

    rng = random.Random(0)
    subs = sorted(pycountry.subdivisions, key=lambda s: s.code)
    countries = sorted({s.country_code for s in subs})
    rows = []
    for sub in rng.sample(subs, 200):
        wrong = rng.sample([c for c in countries if c != sub.country_code], 3)
        options = [sub.country_code, *wrong]
        rng.shuffle(options)
        names = [pycountry.countries.get(alpha_2=c).name for c in options]
        kind = sub.type.lower()
        article = "an" if kind[:1] in "aeiou" else "a"
        rows.append({"question": f"{sub.name} is {article} {kind} of", "choices": names,
                     "answer": options.index(sub.country_code)})
    return {"test": datasets.Dataset.from_list(rows)}
