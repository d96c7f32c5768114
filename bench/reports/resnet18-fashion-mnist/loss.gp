# written by mixprec; re-plot with: cd 'bench/reports/resnet18-fashion-mnist' && gnuplot 'loss.gp'
set terminal pngcairo size 1000,620 noenhanced
set output 'loss.png'
set title 'training loss'
set xlabel 'step'
set ylabel 'loss'
set grid
set datafile missing '?'
set key top right
plot 'loss.dat' index 0 using 1:2 with lines lw 2 title 'fp32', \
     'loss.dat' index 1 using 1:2 with lines lw 2 title 'bf16'
