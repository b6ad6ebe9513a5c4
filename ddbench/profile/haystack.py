"""The text the RULER-style tasks read: shipped with the package, so that no data set is downloaded.

TEXT: original plain prose written for ddbench (public domain, CC0 1.0), about 800 words of everyday
description with no numbers in it, so that a number in a prompt is a needle or a fact the task placed.
RULER's NIAH-2/3 hide their needles in Paul Graham's essays; `essay` tasks hide them in this text, cycled
to the context length (one cycle is about 1,000 tokens, so a 32K prompt repeats it about 32 times).

FACTS: the templates of the `qa` task's document: statements about the harbours of named towns, each with a
year; one of them answers the question, the others are distractors of the same form.
"""

TEXT = """\
The village sits where the valley opens toward the sea, and most mornings a thin fog rolls up from the \
water and settles among the orchards. The people who live there rise early. Bakers light their ovens \
before the birds begin, and by the time the fog lifts the smell of bread has reached the end of the \
long street that runs from the church to the harbour wall.

In spring the hills turn green almost overnight. Shepherds walk their flocks up the narrow paths, and \
children follow them for a while before turning back to school. The river is loud with melted snow, and \
the old stone bridge trembles a little when carts cross it. Nobody worries about the bridge; it has \
trembled for as long as anyone can remember and it has never fallen.

Summer is the season of markets. Traders come from the towns along the coast with cloth, copper pots, \
dried fish and baskets of lemons. They set up their stalls in the square under the plane trees and call \
out their prices in voices that carry over the rooftops. In the evening the square empties slowly, and \
the last traders fold their awnings by lantern light while the swallows circle overhead.

The harbour is small but busy. Fishing boats leave before dawn and return in the early afternoon, low in \
the water when the catch is good. The fishermen mend their nets on the quay and argue about the weather. \
Some say the wind will turn tomorrow; others say it will hold for a week. They are rarely all right and \
rarely all wrong, and the argument is taken up again the next day as if it had never been settled.

Autumn brings the harvest. Apples are picked and pressed, grapes are carried down from the terraces in \
wide baskets, and the air smells of fruit and smoke. Families work together in the fields from morning \
until the light fails. At night they eat in long rooms with the windows open, and the talk is of rain, \
prices, weddings and the health of the old.

Winter is quiet. Snow rarely reaches the village itself, but the mountains behind it turn white and stay \
white until the spring. Storms come in from the sea and rattle the shutters. People mend tools, repair \
roofs and tell stories by the fire. The library in the old customs house stays open in the afternoons, \
and its reading room is warm and almost always full.

The school stands at the top of the hill, beside a field where the children play at noon. The teacher \
has taught there for many years and knows every family by name. She believes that every child should \
learn to read maps, to name the stars and to swim in the cold water of the bay, and most of her pupils \
can do all three before they leave her class.

There is a lighthouse on the headland, painted white with a red band below the lamp. It is no longer \
kept by a keeper; the light turns by itself now. Walkers climb the path to it on clear evenings to watch \
the sun go down over the islands, and lovers carve their initials into the wooden bench that faces west.

The forest to the north is old and dark. Its paths are marked with painted stones, and travellers are \
warned not to leave them. Foresters cut only the fallen trees, and the wood is stacked in long piles to \
dry through the summer. In the clearings there are mushrooms after the rain, and those who know where to \
look come home with full baskets and say nothing about where they found them.

The road to the city climbs over the pass in a long series of bends. It is a slow road, and most people \
take the train instead, which runs along the coast and stops at every small station. From the train the \
sea is visible almost the whole way, grey in winter and a deep clear blue in the summer months.

Every year at midsummer the village holds a festival. Musicians play in the square until late, tables \
are carried out into the street, and everyone brings a dish to share. Old quarrels are set aside for the \
night. When the music stops at last, people walk home slowly under the stars, and the fog comes up again \
from the water to cover the sleeping houses.

Visitors who stay for a while often say that time moves differently here. Days are measured by the tides, \
the bells and the bread, and the seasons turn in their old order. Those who leave tend to come back, if \
only for a summer, to sit on the harbour wall in the evening and watch the boats come in.
"""

TOWNS = ("Ashford", "Brindle", "Carrow", "Dunmore", "Elsworth", "Farleigh", "Glenrock", "Harwick", "Ivybridge",
         "Kelso", "Larkhill", "Marden", "Northam", "Oakley", "Penrith", "Redcliff", "Stowe", "Thornbury",
         "Upton", "Westbury")
FACT = " The harbour of {town} was built in the year {year}, and its first pier was made of {stone}."
STONES = ("granite", "limestone", "sandstone", "slate", "basalt", "marble")
QUESTION = ("\nAnswer the question from the text above. Question: in which year was the harbour of {town} built?"
            " Answer: the harbour of {town} was built in the year")
