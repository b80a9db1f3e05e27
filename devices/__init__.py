"""devices package of meshtwin (see ../README.md and DESIGN layout)."""
