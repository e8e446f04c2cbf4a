"""Stage 2 of treadle.constrained: JSON Schema -> regex.

Takes a JSON Schema of any draft (03 to 2020-12: json_schema_dialects.py reads it as 2020-12,
json_schema_documents.py resolves the meta-schemas it names) and gives a regex of the regex/
dialect whose every match is valid JSON under the schema (json_schema.py, the entry points and
the converter, whose ``$ref`` / ``anyOf``-``oneOf`` / string / listed-value writing are mixins in
json_schema_refs.py, json_schema_oneof.py, json_schema_strings.py and json_schema_listed.py;
string_shapes.py fits a pattern or format to length bounds; json_schema_parts.py and
json_schema_logic.py its keyword builders and rewrites, regex_numbers.py bounded numbers,
members.py an object's declared properties as one node), or a ``ValueError`` naming what it
cannot enforce.

Imports regex/, and the private code points of index/ (index_markers.py, json_holes.py) that
a translator writes into the regex for the index to read. Does not import torch.
"""
